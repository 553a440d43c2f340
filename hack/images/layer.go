package images

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Epoch is the time of every file, layer and image config: builds are
// reproducible, and the digest only changes when the content does.
var Epoch = time.Unix(0, 0).UTC()

// normalize checks and sorts a layer's entries and adds the parent
// directories that are not listed (root, 0755).
func normalize(files []File) ([]File, error) {
	byPath := map[string]File{}
	for _, f := range files {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "/" {
			return nil, fmt.Errorf("image path %q: must be absolute and clean", f.Path)
		}
		kinds := 0
		for _, set := range []bool{f.Src != "", f.Data != nil, f.Link != "", f.Dir} {
			if set {
				kinds++
			}
		}
		if kinds != 1 {
			return nil, fmt.Errorf("image path %s: set exactly one of Src, Data, Link, Dir", f.Path)
		}
		if f.Mode == 0 {
			f.Mode = 0o644
			if f.Dir || f.Src != "" {
				f.Mode = 0o755
			}
		}
		if old, ok := byPath[f.Path]; ok && !sameEntry(old, f) {
			return nil, fmt.Errorf("image path %s is listed twice, differently", f.Path)
		}
		byPath[f.Path] = f
	}
	for p := range byPath {
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if old, ok := byPath[d]; ok {
				if !old.Dir {
					return nil, fmt.Errorf("image path %s: parent %s is not a directory", p, d)
				}
				continue
			}
			byPath[d] = File{Path: d, Dir: true, Mode: 0o755}
		}
	}
	out := make([]File, 0, len(byPath))
	for _, f := range byPath {
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

func sameEntry(a, b File) bool {
	return a.Src == b.Src && string(a.Data) == string(b.Data) && a.Link == b.Link && a.Dir == b.Dir &&
		a.Mode == b.Mode && a.UID == b.UID && a.GID == b.GID && a.Caps == b.Caps
}

func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

// vfsCapData is the security.capability xattr value (VFS_CAP_REVISION_2,
// effective) granting the capabilities caps as permitted.
func vfsCapData(caps uint64) string {
	b := make([]byte, 20)
	binary.LittleEndian.PutUint32(b[0:], 0x02000000|0x1)
	binary.LittleEndian.PutUint32(b[4:], uint32(caps))
	binary.LittleEndian.PutUint32(b[12:], uint32(caps>>32))
	return string(b)
}

// writeTar writes the normalized entries as an uncompressed tar stream.
func writeTar(w io.Writer, files []File) error {
	tw := tar.NewWriter(w)
	for _, f := range files {
		hdr := &tar.Header{
			Name:    strings.TrimPrefix(f.Path, "/"),
			Mode:    tarMode(f.Mode),
			Uid:     f.UID,
			Gid:     f.GID,
			ModTime: Epoch,
		}
		var src *os.File
		switch {
		case f.Dir:
			hdr.Typeflag = tar.TypeDir
			hdr.Name += "/"
		case f.Link != "":
			hdr.Typeflag = tar.TypeSymlink
			hdr.Linkname = f.Link
		case f.Data != nil:
			hdr.Typeflag = tar.TypeReg
			hdr.Size = int64(len(f.Data))
		default:
			var err error
			if src, err = os.Open(f.Src); err != nil {
				return missingError(f, err)
			}
			fi, err := src.Stat()
			if err != nil {
				src.Close()
				return err
			}
			if !fi.Mode().IsRegular() {
				src.Close()
				return fmt.Errorf("%s: not a regular file", f.Src)
			}
			hdr.Typeflag = tar.TypeReg
			hdr.Size = fi.Size()
		}
		if f.Caps != 0 {
			hdr.PAXRecords = map[string]string{"SCHILY.xattr.security.capability": vfsCapData(f.Caps)}
			hdr.Format = tar.FormatPAX
		}
		if err := tw.WriteHeader(hdr); err != nil {
			if src != nil {
				src.Close()
			}
			return fmt.Errorf("%s: %w", f.Path, err)
		}
		var err error
		switch {
		case src != nil:
			_, err = io.CopyN(tw, src, hdr.Size)
			src.Close()
		case f.Data != nil:
			_, err = tw.Write(f.Data)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", f.Path, err)
		}
	}
	return tw.Close()
}

func missingError(f File, err error) error {
	if f.Missing != "" && os.IsNotExist(err) {
		return fmt.Errorf("%s is not built: run %s", f.Src, f.Missing)
	}
	return err
}

// fileLayer is a gzip-compressed layer kept in a file (the layer cache).
type fileLayer struct {
	path           string
	diffID, digest v1.Hash
	size           int64
}

func (l *fileLayer) Digest() (v1.Hash, error)            { return l.digest, nil }
func (l *fileLayer) DiffID() (v1.Hash, error)            { return l.diffID, nil }
func (l *fileLayer) Size() (int64, error)                { return l.size, nil }
func (l *fileLayer) MediaType() (types.MediaType, error) { return types.OCILayer, nil }
func (l *fileLayer) Compressed() (io.ReadCloser, error)  { return os.Open(l.path) }
func (l *fileLayer) Uncompressed() (io.ReadCloser, error) {
	f, err := os.Open(l.path)
	if err != nil {
		return nil, err
	}
	zr, err := gzip.NewReader(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{zr, f}, nil
}

// newLayer makes the layer of the normalized entries. The tar stream is
// hashed first (its diffID); the gzip-compressed blob is kept in cacheDir
// under that hash, so that unchanged layers are not compressed again and
// keep their digest whatever the compressor does.
func newLayer(cacheDir string, files []File) (*fileLayer, error) {
	h := sha256.New()
	if err := writeTar(h, files); err != nil {
		return nil, err
	}
	diffID := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}
	blob := filepath.Join(cacheDir, "sha256-"+diffID.Hex+".tar.gz")
	meta := blob + ".digest"
	if b, err := os.ReadFile(meta); err == nil {
		if digest, size, ok := parseMeta(string(b)); ok {
			if fi, err := os.Stat(blob); err == nil && fi.Size() == size {
				return &fileLayer{path: blob, diffID: diffID, digest: digest, size: size}, nil
			}
		}
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return nil, err
	}
	tmp, err := os.CreateTemp(cacheDir, ".layer-*")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	zh := sha256.New()
	cw := &countWriter{w: io.MultiWriter(tmp, zh)}
	zw, err := gzip.NewWriterLevel(cw, gzip.DefaultCompression)
	if err != nil {
		return nil, err
	}
	uh := sha256.New()
	err = writeTar(io.MultiWriter(zw, uh), files)
	if err == nil {
		err = zw.Close()
	}
	if err == nil {
		err = tmp.Close()
	} else {
		tmp.Close()
	}
	if err != nil {
		return nil, err
	}
	if got := hex.EncodeToString(uh.Sum(nil)); got != diffID.Hex {
		return nil, fmt.Errorf("layer content changed while it was built (a source file was being written?)")
	}
	digest := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(zh.Sum(nil))}
	if err := os.Rename(tmp.Name(), blob); err != nil {
		return nil, err
	}
	if err := os.WriteFile(meta, []byte(digest.String()+" "+strconv.FormatInt(cw.n, 10)+"\n"), 0o644); err != nil {
		return nil, err
	}
	return &fileLayer{path: blob, diffID: diffID, digest: digest, size: cw.n}, nil
}

func parseMeta(s string) (v1.Hash, int64, bool) {
	fields := strings.Fields(s)
	if len(fields) != 2 {
		return v1.Hash{}, 0, false
	}
	digest, err := v1.NewHash(fields[0])
	if err != nil {
		return v1.Hash{}, 0, false
	}
	size, err := strconv.ParseInt(fields[1], 10, 64)
	if err != nil {
		return v1.Hash{}, 0, false
	}
	return digest, size, true
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
