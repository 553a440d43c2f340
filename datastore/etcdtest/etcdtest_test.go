//go:build integration

package etcdtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/apiaryhq/apiary/datastore/etcdtest"
)

func TestStartEnablesAuth(t *testing.T) {
	start := time.Now()
	s := etcdtest.Start(t)
	t.Logf("etcd ready with auth in %s", time.Since(start))

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	root := s.RootClient(t)
	st, err := root.AuthStatus(ctx)
	if err != nil {
		t.Fatalf("AuthStatus as root: %v", err)
	}
	if !st.Enabled {
		t.Fatal("auth is not enabled")
	}
	if _, err := root.Put(ctx, "/k", "v"); err != nil {
		t.Fatalf("put as root: %v", err)
	}
	u, err := root.UserGet(ctx, "root")
	if err != nil || len(u.Roles) != 1 || u.Roles[0] != "root" {
		t.Fatalf("root user: %v, %v; want roles [root]", u, err)
	}

	s.Stop()
	s.Stop() // idempotent
	short, cancel2 := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel2()
	if _, err := root.Get(short, "/k"); err == nil {
		t.Fatal("get after Stop succeeded")
	}
}

func TestStartWithoutAuth(t *testing.T) {
	s := etcdtest.Start(t, etcdtest.WithoutAuth())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := s.RootClient(t).AuthStatus(ctx)
	if err != nil {
		t.Fatalf("AuthStatus: %v", err)
	}
	if st.Enabled {
		t.Fatal("auth is enabled with WithoutAuth")
	}
}
