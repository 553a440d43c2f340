package controllers

import (
	"context"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/apiaryhq/apiary/datastore"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// Reasons of an external DataStore's PeerPortClosed condition.
const (
	ReasonPeerPortRefusesTenants = "RefusesTenantCertificates"
	ReasonPeerPortAcceptsTenants = "AcceptsTenantCertificates"
	ReasonPeerPortUnencrypted    = "PlainHTTP"
	ReasonPeerPortNotChecked     = "NotChecked"
)

// peerProbeInterval: an etcd's peer TLS changes with its members' flags,
// rarely; a probe issues a certificate and dials every member.
const peerProbeInterval = 10 * time.Minute

// peerProbeMark is a DataStore's last peer probe: when, with which
// configuration, and its verdict, set again on every reconcile until the
// next probe (a status write that failed must not lose it for an interval).
type peerProbeMark struct {
	at          time.Time
	configHash  string
	status      metav1.ConditionStatus
	reason, msg string
}

// due says whether a probe with this configuration is due now.
func (m peerProbeMark) due(configHash string, now time.Time) bool {
	return m.configHash != configHash || now.Sub(m.at) >= peerProbeInterval
}

// checkPeerPorts probes an external DataStore's peer ports with a
// certificate of its CA made like a tenant's (PeerPortClosed). Apiary
// cannot configure an etcd it does not run; it can say when that etcd lets
// every tenant speak raft. A managed etcd's peer port trusts only its peer
// CA (PeerCASeparate), and its network policy keeps the operator away from
// it, so it is not probed.
func (r *DataStoreReconciler) checkPeerPorts(ctx context.Context, ds *apiary.DataStore) {
	if ds.Spec.Managed != nil {
		return
	}
	cfg, err := dataStoreConfig(ctx, r.APIReader, ds, r.ClusterDomain)
	if err != nil {
		return
	}
	hash, now := cfg.Hash(), r.now()
	if last, ok := r.peers.get(ds.UID); ok && !last.due(hash, now) {
		r.set(ds, apiary.ConditionPeerPortClosed, last.status, last.reason, last.msg)
		return
	}
	dc, err := r.client(ctx, ds)
	if err != nil {
		return
	}
	callCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	m := peerProbeMark{at: now, configHash: hash}
	if probes, err := dc.ProbePeers(callCtx, cfg); err != nil {
		m.status, m.reason, m.msg = metav1.ConditionUnknown, ReasonPeerPortNotChecked, "the peer ports could not be probed: "+err.Error()
	} else {
		m.status, m.reason, m.msg = peerVerdict(probes)
	}
	r.peers.set(ds.UID, m)
	r.set(ds, apiary.ConditionPeerPortClosed, m.status, m.reason, m.msg)
}

// peerVerdict sums up the probes of every member's peer URL.
func peerVerdict(probes []datastore.PeerProbe) (metav1.ConditionStatus, string, string) {
	var open, plain, unknown, refused []string
	for _, p := range probes {
		switch {
		case p.Open && p.Plain:
			plain = append(plain, p.URL)
		case p.Open:
			open = append(open, p.URL)
		case p.Refused:
			refused = append(refused, p.URL)
		default:
			unknown = append(unknown, p.URL+" ("+p.Detail+")")
		}
	}
	switch {
	case len(plain) > 0:
		return metav1.ConditionFalse, ReasonPeerPortUnencrypted, fmt.Sprintf(
			"peer URLs %s are plain HTTP: anyone who reaches them speaks raft to this etcd (read, write, stop it for every tenant); serve them over TLS with --peer-client-cert-auth and a CA of their own",
			strings.Join(plain, ", "))
	case len(open) > 0:
		return metav1.ConditionFalse, ReasonPeerPortAcceptsTenants, fmt.Sprintf(
			"peer URLs %s accept a certificate of this DataStore's CA, which signs every tenant's: any tenant can speak raft to this etcd (read, write, stop it for every tenant); give the peer port a CA of its own (--peer-trusted-ca-file) and --peer-cert-allowed-cn",
			strings.Join(open, ", "))
	case len(unknown) > 0:
		return metav1.ConditionUnknown, ReasonPeerPortNotChecked, "could not tell whether these peer URLs refuse tenant certificates: " + strings.Join(unknown, "; ")
	case len(refused) == 0:
		return metav1.ConditionUnknown, ReasonPeerPortNotChecked, "the members list no peer URL"
	}
	return metav1.ConditionTrue, ReasonPeerPortRefusesTenants, fmt.Sprintf(
		"peer URLs %s refuse a certificate of this DataStore's CA (as a tenant's)", strings.Join(refused, ", "))
}
