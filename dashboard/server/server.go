// Package server puts the dashboard together: its pages and assets,
// embedded in the binary (nothing is fetched from elsewhere), and its API,
// each request made as the signed-in user, or, run locally, with the
// user's own kubeconfig.
package server

import (
	"crypto/rand"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net"
	"net/http"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/dashboard/asuser"
	"github.com/apiaryhq/apiary/dashboard/live"
	"github.com/apiaryhq/apiary/dashboard/session"
	"github.com/apiaryhq/apiary/dashboard/signin"
)

//go:embed assets
var assets embed.FS

var pages = template.Must(template.ParseFS(assets, "assets/*.tmpl", "assets/*.html"))

// Options choose how the dashboard reaches the API: signed-in users
// (Clients and SignIn) or, run locally, one user's own client (Local).
// Kubeconfig and CheckSwitch are the actions that need more than a
// client (the CLI's own, so the page does what the commands do); without
// them those actions answer 501.
type Options struct {
	Clients     *asuser.Clients
	SignIn      *signin.Handler
	Local       client.WithWatch
	Kubeconfig  KubeconfigFunc
	CheckSwitch CheckSwitchFunc
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
	var guard func(h func(http.ResponseWriter, *http.Request, session.Session)) http.Handler
	if local {
		guard, err = localGuard()
		if err != nil {
			return nil, err
		}
	} else {
		guard = opts.SignIn.Require
	}
	// withClient runs h with the request's client.
	withClient := func(h func(http.ResponseWriter, *http.Request, client.WithWatch)) http.Handler {
		return guard(func(w http.ResponseWriter, r *http.Request, s session.Session) {
			c, err := as(s)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			h(w, r, c)
		})
	}
	page := func(name string) http.Handler {
		return guard(func(w http.ResponseWriter, r *http.Request, s session.Session) {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.Header().Set("Cache-Control", "no-store")
			_ = pages.ExecuteTemplate(w, name, struct {
				User, CSRF, Namespace, Name string
				Local                       bool
			}{s.User, s.CSRF, r.PathValue("namespace"), r.PathValue("name"), local})
		})
	}
	mux := http.NewServeMux()
	// The kubelet's probes: says nothing but that the process serves.
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	if !local {
		for _, p := range []string{signin.LoginPath, signin.CallbackPath, signin.LogoutPath, signin.LoggedOutPath} {
			mux.Handle(p, opts.SignIn)
		}
	}
	// Even the assets only after sign-in: unauthenticated requests see
	// nothing but the login page.
	files := http.StripPrefix("/assets/", http.FileServerFS(static))
	mux.Handle("GET /assets/", guard(func(w http.ResponseWriter, r *http.Request, _ session.Session) { files.ServeHTTP(w, r) }))
	mux.Handle("GET /{$}", page("index.html"))
	mux.Handle("GET /tenants/{namespace}/{name}", page("tenant.html"))
	mux.Handle("GET /api/tenants/stream", withClient(func(w http.ResponseWriter, r *http.Request, c client.WithWatch) {
		live.Stream(w, r, c, r.URL.Query().Get("namespace"))
	}))
	mux.Handle("GET /datastores/{name}", page("datastore.html"))
	mux.Handle("GET /hosts/{namespace}/{name}", page("host.html"))
	mux.Handle("GET /api/datastores/{name}/stream", withClient(func(w http.ResponseWriter, r *http.Request, c client.WithWatch) {
		name := r.PathValue("name")
		if !dnsSubdomain.MatchString(name) {
			http.Error(w, fmt.Sprintf("name %q must be a DNS subdomain", name), http.StatusBadRequest)
			return
		}
		live.DataStoreStream(w, r, c, name)
	}))
	mux.Handle("GET /api/hosts/{namespace}/{name}/stream", withClient(func(w http.ResponseWriter, r *http.Request, c client.WithWatch) {
		ns, name := r.PathValue("namespace"), r.PathValue("name")
		if !dnsLabel.MatchString(ns) || !dnsSubdomain.MatchString(name) {
			http.Error(w, fmt.Sprintf("namespace %q must be a DNS label and name %q a DNS subdomain", ns, name), http.StatusBadRequest)
			return
		}
		live.HostStream(w, r, c, ns, name)
	}))
	mux.Handle("GET /api/infrastructure/stream", withClient(func(w http.ResponseWriter, r *http.Request, c client.WithWatch) {
		live.Infrastructure(w, r, c, r.URL.Query().Get("namespace"))
	}))
	mux.Handle("GET /api/tenants/{namespace}/{name}/stream", withClient(func(w http.ResponseWriter, r *http.Request, c client.WithWatch) {
		key, err := tenantKey(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		live.TenantStream(w, r, c, key.Namespace, key.Name)
	}))
	mux.Handle("POST /api/tenants/{namespace}/{name}/kubeconfig", withClient(func(w http.ResponseWriter, r *http.Request, c client.WithWatch) {
		kubeconfig(w, r, c, opts.Kubeconfig)
	}))
	mux.Handle("POST /api/tenants/{namespace}/{name}/scale", withClient(func(w http.ResponseWriter, r *http.Request, c client.WithWatch) {
		scale(w, r, c)
	}))
	mux.Handle("POST /api/tenants/{namespace}/{name}/mode/check", withClient(func(w http.ResponseWriter, r *http.Request, c client.WithWatch) {
		checkSwitch(w, r, c, opts.CheckSwitch)
	}))
	mux.Handle("POST /api/tenants/{namespace}/{name}/mode", withClient(func(w http.ResponseWriter, r *http.Request, c client.WithWatch) {
		switchMode(w, r, c)
	}))
	return headers(mux), nil
}

// localGuard protects the local dashboard, which acts with the user's
// kubeconfig and has no sign-in, from the other sites the user's browser
// visits: a request must name a loopback host (a DNS-rebound name would
// let another site read the pages), and every action must echo a token
// the pages carry (other sites cannot read them, so cannot forge one).
func localGuard() (func(func(http.ResponseWriter, *http.Request, session.Session)) http.Handler, error) {
	token := make([]byte, 32)
	if _, err := rand.Read(token); err != nil {
		return nil, fmt.Errorf("dashboard: CSRF token: %w", err)
	}
	s := session.Session{CSRF: base64.RawURLEncoding.EncodeToString(token)}
	return func(h func(http.ResponseWriter, *http.Request, session.Session)) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			host, _, err := net.SplitHostPort(r.Host)
			if err != nil {
				host = r.Host
			}
			if ip := net.ParseIP(strings.Trim(host, "[]")); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
				http.Error(w, fmt.Sprintf("host %q: the local dashboard answers only on a loopback address", r.Host), http.StatusMisdirectedRequest)
				return
			}
			if r.Method != http.MethodGet && r.Method != http.MethodHead {
				if err := s.CheckCSRF(r); err != nil {
					http.Error(w, err.Error(), http.StatusForbidden)
					return
				}
			}
			h(w, r, s)
		})
	}, nil
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
