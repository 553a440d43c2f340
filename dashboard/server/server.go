// Package server puts the dashboard together: its pages and assets,
// embedded in the binary (nothing is fetched from elsewhere), and its API,
// each request made as the signed-in user, or, run locally, with the
// user's own kubeconfig.
package server

import (
	"embed"
	"errors"
	"html/template"
	"io/fs"
	"net/http"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/dashboard/asuser"
	"github.com/apiaryhq/apiary/dashboard/live"
	"github.com/apiaryhq/apiary/dashboard/session"
	"github.com/apiaryhq/apiary/dashboard/signin"
)

//go:embed assets
var assets embed.FS

var index = template.Must(template.ParseFS(assets, "assets/index.html"))

// Options choose how the dashboard reaches the API: signed-in users
// (Clients and SignIn) or, run locally, one user's own client (Local).
type Options struct {
	Clients *asuser.Clients
	SignIn  *signin.Handler
	Local   client.WithWatch
}

// New returns the dashboard's handler.
func New(opts Options) (http.Handler, error) {
	local := opts.Local != nil
	if local == (opts.Clients != nil || opts.SignIn != nil) || !local && (opts.Clients == nil || opts.SignIn == nil) {
		return nil, errors.New("dashboard: either a local client, or both per-user clients and a sign-in")
	}
	static, err := fs.Sub(assets, "assets")
	if err != nil {
		return nil, err
	}
	// as resolves the client of a request: the user's own (local) or one
	// impersonating the session's user.
	as := func(s session.Session) (client.WithWatch, error) {
		if local {
			return opts.Local, nil
		}
		return opts.Clients.For(s)
	}
	guard := func(h func(http.ResponseWriter, *http.Request, session.Session)) http.Handler {
		if local {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h(w, r, session.Session{}) })
		}
		return opts.SignIn.Require(h)
	}
	mux := http.NewServeMux()
	if !local {
		for _, p := range []string{signin.LoginPath, signin.CallbackPath, signin.LogoutPath} {
			mux.Handle(p, opts.SignIn)
		}
	}
	// Even the assets only after sign-in: unauthenticated requests see
	// nothing but the login page.
	files := http.StripPrefix("/assets/", http.FileServerFS(static))
	mux.Handle("GET /assets/", guard(func(w http.ResponseWriter, r *http.Request, _ session.Session) { files.ServeHTTP(w, r) }))
	mux.Handle("GET /{$}", guard(func(w http.ResponseWriter, r *http.Request, s session.Session) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_ = index.Execute(w, struct {
			User, CSRF string
			Local      bool
		}{s.User, s.CSRF, local})
	}))
	mux.Handle("GET /api/tenants/stream", guard(func(w http.ResponseWriter, r *http.Request, s session.Session) {
		c, err := as(s)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		live.Stream(w, r, c, r.URL.Query().Get("namespace"))
	}))
	return headers(mux), nil
}

// headers set what every answer carries: scripts and styles only from
// the dashboard itself, no framing (clickjacking), no referrer to other
// sites.
func headers(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'; form-action 'self'")
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		next.ServeHTTP(w, r)
	})
}
