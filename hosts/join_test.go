package hosts

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestTail(t *testing.T) {
	// kubeadm's coloured preflight output, as seen from a v1.37 host.
	out := "a\nb\n\x1b[0;37mOS\x1b[0m: \x1b[0;32mLinux\x1b[0m\r\nlast\x07 line\n"
	if got, want := tail(out, 2), "OS: Linux\nlast line"; got != want {
		t.Errorf("tail: %q, want %q", got, want)
	}
	// A host whose owner prints one endless line: bounded, valid UTF-8.
	long := strings.Repeat("é", 1<<20) + "\nend"
	got := tail(long, 15)
	if len(got) > maxTail+len("…") || !strings.HasSuffix(got, "\nend") || !strings.HasPrefix(got, "…") {
		t.Errorf("tail of a 2 MiB line: %d bytes, ends %q", len(got), got[len(got)-10:])
	}
	if !utf8.ValidString(got) {
		t.Error("tail cut a character in two: not valid UTF-8")
	}
}
