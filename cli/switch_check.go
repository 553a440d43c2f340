package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/hosts"
	apiaryv1alpha1 "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
)

// switchCheck is one check of a switch, with its result.
type switchCheck struct {
	// Subject is what was checked: the tenant, the DataStore, a Host.
	Subject string
	What    string
	OK      bool
	Detail  string
}

// checkSwitch checks, changing nothing, whether a switch of tcp to target
// can go through: the API server accepts the change (server-side dry run)
// and, to registered, the DataStore has an address for hosts and every
// control-plane Host is installed, answers SSH with its pinned key, has the
// control plane's ports free and reaches the DataStore and the tenant
// endpoint, from the host itself, with the tenant's own credentials.
//
// The checks run from this machine (it must reach the hosts over SSH, as
// the operator does) with the caller's rights: reading the Hosts' SSH key
// Secrets and the tenant's Secrets.
func checkSwitch(ctx context.Context, c client.Client, tcp *apiaryv1alpha1.TenantControlPlane, target apiaryv1alpha1.Mode) ([]switchCheck, error) {
	tenant := "tenant " + tcp.Name
	var out []switchCheck
	add := func(subject, what string, err error, ok string) {
		chk := switchCheck{Subject: subject, What: what, OK: err == nil, Detail: ok}
		if err != nil {
			chk.Detail = err.Error()
		}
		out = append(out, chk)
	}
	dry := tcp.DeepCopy()
	patch := client.MergeFrom(tcp.DeepCopy())
	dry.Spec.Mode = target
	add(tenant, "spec.mode "+string(target)+" accepted (server-side dry run)",
		c.Patch(ctx, dry, patch, client.DryRunAll), "the API server and its webhooks accept it")
	if target != apiaryv1alpha1.ModeRegistered {
		// Back to hosted pods: the Deployment's template is kept at 0
		// replicas; nothing on the hosts needs to be reachable first.
		return out, nil
	}

	var ds apiaryv1alpha1.DataStore
	dsName := tcp.Status.DataStore.Name
	var dsErr error
	switch {
	case dsName == "":
		dsErr = fmt.Errorf("the tenant is not bound to a DataStore yet")
	default:
		if err := c.Get(ctx, client.ObjectKey{Name: dsName}, &ds); err != nil {
			dsErr = request{verb: "get", resource: "datastores.apiary.dev", name: dsName}.explain(err)
		} else if cond := meta.FindStatusCondition(ds.Status.Conditions, apiaryv1alpha1.ConditionHostAccessReady); len(ds.Status.HostEndpoints) == 0 || cond == nil || cond.Status != metav1.ConditionTrue {
			why := "spec.hostAccess is not set"
			if cond != nil {
				why = cond.Message
			}
			dsErr = fmt.Errorf("%s", why)
		}
	}
	add("DataStore "+dsName, "reachable from hosts (HostAccessReady)", dsErr, fmt.Sprint(ds.Status.HostEndpoints))

	var list apiaryv1alpha1.HostList
	if err := c.List(ctx, &list, client.InNamespace(tcp.Namespace)); err != nil {
		return nil, request{verb: "list", resource: resourceHosts, namespace: tcp.Namespace}.explain(err)
	}
	var cp []apiaryv1alpha1.Host
	for _, h := range list.Items {
		if h.Spec.TenantControlPlane == tcp.Name && h.Spec.Role == apiaryv1alpha1.HostRoleControlPlane {
			cp = append(cp, h)
		}
	}
	slices.SortFunc(cp, func(a, b apiaryv1alpha1.Host) int { return strings.Compare(a.Name, b.Name) })
	if len(cp) == 0 {
		add(tenant, "has a Host with role control-plane", fmt.Errorf("none; add one with: apiary host add NAME --tenant %s --role control-plane ...", tcp.Name), "")
		return out, nil
	}

	// The tenant's credentials, as its control plane on a host uses them.
	secrets := map[render.SecretKind]map[string][]byte{}
	for _, kind := range []render.SecretKind{render.SecretCA, render.SecretDataStoreClient, render.SecretAPIServerKubeletClient} {
		var s corev1.Secret
		if err := c.Get(ctx, client.ObjectKey{Namespace: tcp.Namespace, Name: render.SecretName(tcp, kind)}, &s); err != nil {
			return nil, request{verb: "get", resource: resourceSecrets, namespace: tcp.Namespace, name: render.SecretName(tcp, kind)}.explain(err)
		}
		secrets[kind] = s.Data
	}
	etcdTLS, err := clientTLS(secrets[render.SecretDataStoreClient][render.KeyCACert], secrets[render.SecretDataStoreClient])
	if err != nil {
		return nil, fmt.Errorf("the tenant's datastore client certificate: %w", err)
	}
	endpoint, err := url.Parse(tcp.Status.Endpoint)
	if err != nil || tcp.Status.Endpoint == "" {
		return nil, fmt.Errorf("the tenant has no endpoint yet (status.endpoint %q)", tcp.Status.Endpoint)
	}
	apiTLS, err := clientTLS(secrets[render.SecretCA][render.KeyTLSCert], secrets[render.SecretAPIServerKubeletClient])
	if err != nil {
		return nil, fmt.Errorf("the tenant's kubelet client certificate: %w", err)
	}
	defaulted := tcp.DeepCopy()
	defaulted.Default()
	port, _ := strconv.Atoi(endpoint.Port())
	ports := render.StaticPodPorts(render.Inputs{TCP: defaulted, Version: defaulted.Spec.Version, Endpoint: render.Endpoint{Host: endpoint.Hostname(), Port: int32(port)}})

	for _, h := range cp {
		subject := fmt.Sprintf("Host %s (%s)", h.Name, h.Spec.Address)
		var installed error
		if c := meta.FindStatusCondition(h.Status.Conditions, apiaryv1alpha1.HostConditionInstalled); c == nil || c.Status != metav1.ConditionTrue {
			installed = fmt.Errorf("phase %s: the switch uses it once the node software is installed", orDash(string(h.Status.Phase)))
			if c != nil {
				installed = fmt.Errorf("phase %s, %s: %s", orDash(string(h.Status.Phase)), c.Reason, c.Message)
			}
		}
		state := "installed, joins when the switch starts (phase Standby)"
		if h.Status.Phase == apiaryv1alpha1.HostPhaseReady {
			state = "joined as node " + h.Status.NodeName
		}
		add(subject, "node software installed", installed, state)
		t, _, err := hosts.TargetOf(ctx, c, &h)
		if err != nil {
			add(subject, "SSH with the pinned host key", err, "")
			continue
		}
		dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		hc, err := hosts.Dial(dctx, t)
		cancel()
		add(subject, "SSH with the pinned host key", err, "connected as "+t.User)
		if err != nil {
			continue
		}
		serving := false
		for _, s := range tcp.Status.ControlPlaneHosts {
			if s.Host == h.Name && s.Step != apiaryv1alpha1.HostStepStop {
				serving = true
			}
		}
		if serving {
			add(subject, "control-plane ports free", nil, "the tenant's control plane already runs there")
		} else {
			used, err := hosts.PortsInUse(ctx, hc, ports)
			if err == nil && len(used) > 0 {
				err = fmt.Errorf("in use: %v (the control plane listens on %v)", used, ports)
			}
			add(subject, "control-plane ports free", err, fmt.Sprint(ports))
		}
		if len(ds.Status.HostEndpoints) > 0 {
			u := ds.Status.HostEndpoints[0] + "/health"
			add(subject, "reaches the DataStore with the tenant's etcd certificate", getOK(ctx, hc, u, etcdTLS), u)
		}
		u := tcp.Status.Endpoint + "/readyz"
		add(subject, "reaches the tenant endpoint with the tenant's credentials", getOK(ctx, hc, u, apiTLS), u)
		hc.Close()
	}
	return out, nil
}

func getOK(ctx context.Context, hc *hosts.Client, u string, cfg *tls.Config) error {
	code, err := hc.GetFromHost(ctx, u, cfg)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("GET %s: HTTP %d", u, code)
	}
	return nil
}

// clientTLS is a TLS client configuration trusting caPEM and presenting
// the certificate and key of a Secret's data.
func clientTLS(caPEM []byte, data map[string][]byte) (*tls.Config, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("no CA certificate")
	}
	cert, err := tls.X509KeyPair(data[render.KeyTLSCert], data[render.KeyTLSKey])
	if err != nil {
		return nil, err
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// printChecks prints every check and whether all passed.
func printChecks(w io.Writer, checks []switchCheck) bool {
	ok := true
	for _, c := range checks {
		mark := "✓"
		if !c.OK {
			mark, ok = "✗", false
		}
		fmt.Fprintf(w, "%s %s: %s", mark, c.Subject, c.What)
		if c.Detail != "" {
			fmt.Fprintf(w, " — %s", c.Detail)
		}
		fmt.Fprintln(w)
	}
	return ok
}
