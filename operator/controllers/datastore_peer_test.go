package controllers

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/apiaryhq/apiary/datastore"
)

func TestPeerVerdict(t *testing.T) {
	refused := datastore.PeerProbe{URL: "https://a:2380", Refused: true}
	open := datastore.PeerProbe{URL: "https://b:2380", Open: true}
	plain := datastore.PeerProbe{URL: "http://c:2380", Open: true, Plain: true}
	silent := datastore.PeerProbe{URL: "https://d:2380", Detail: "i/o timeout"}
	for _, tc := range []struct {
		name   string
		probes []datastore.PeerProbe
		status metav1.ConditionStatus
		reason string
	}{
		{"all refuse", []datastore.PeerProbe{refused, refused}, metav1.ConditionTrue, ReasonPeerPortRefusesTenants},
		{"one accepts", []datastore.PeerProbe{refused, open}, metav1.ConditionFalse, ReasonPeerPortAcceptsTenants},
		{"one plain, one silent", []datastore.PeerProbe{silent, plain}, metav1.ConditionFalse, ReasonPeerPortUnencrypted},
		{"one silent", []datastore.PeerProbe{refused, silent}, metav1.ConditionUnknown, ReasonPeerPortNotChecked},
		{"none", nil, metav1.ConditionUnknown, ReasonPeerPortNotChecked},
	} {
		status, reason, msg := peerVerdict(tc.probes)
		if status != tc.status || reason != tc.reason || msg == "" {
			t.Errorf("%s: %s %s %q; want %s %s", tc.name, status, reason, msg, tc.status, tc.reason)
		}
	}
}

func TestPeerProbeDue(t *testing.T) {
	now := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	m := peerProbeMark{at: now, configHash: "h1", status: metav1.ConditionTrue, reason: "R"}
	if m.due("h1", now.Add(time.Minute)) {
		t.Error("due again a minute later")
	}
	if !m.due("h2", now.Add(time.Minute)) {
		t.Error("not due after the credentials changed")
	}
	if !m.due("h1", now.Add(peerProbeInterval)) {
		t.Error("not due after the interval")
	}
}
