package controllers

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"
	bootstraputil "k8s.io/cluster-bootstrap/token/util"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/apiaryhq/apiary/hosts"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
	"github.com/apiaryhq/apiary/pki"
	"github.com/apiaryhq/apiary/tenant"
)

const (
	StepJoin = "join"
	// StepDrain evicts a deleted Host's pods, a pass per reconcile.
	StepDrain = "drain"
	// StepReset resets a deleted Host's host (kubeadm reset, the node
	// software removed), off the reconcile workers like every SSH step.
	StepReset = "reset"
	// HostFinalizer resets the host and removes its Node before the Host
	// goes away.
	HostFinalizer = "apiary.dev/host-cleanup"

	ReasonTenantNotReady = "TenantNotReady"
	ReasonJoinFailed     = "JoinFailed"
	ReasonJoined         = "Joined"
	ReasonNodeNotFound   = "NodeNotFound"
	ReasonCleanupFailed  = "CleanupFailed"
	// ReasonHostNotReset: a deleted Host was let go without a reset (its
	// key Secret or namespace is gone).
	ReasonHostNotReset = "HostNotReset"

	// joinTokenTTL bounds a join token's life should the operator never
	// get to delete it.
	joinTokenTTL = time.Hour
	// drainPoll is how often a drain looks again at the pods left.
	drainPoll = 2 * time.Second
	// drainTimeout bounds how long eviction is tried before the host is
	// reset anyway.
	drainTimeout = 2 * time.Minute
)

// tenantAccess is what the agent needs of a host's tenant.
type tenantAccess struct {
	tcp   *apiary.TenantControlPlane
	cs    kubernetes.Interface
	caPEM []byte
	// trustPEM is the CA bundle the tenant trusts (its CA; two during a
	// CA rotation).
	trustPEM []byte
	endpoint string // host:port
}

// tenant reads the host's tenant and builds a client from its admin
// kubeconfig. A tenant that is not Ready is a retryable failure.
func (r *HostReconciler) tenant(ctx context.Context, h *apiary.Host) (*tenantAccess, string, error) {
	var tcp apiary.TenantControlPlane
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: h.Namespace, Name: h.Spec.TenantControlPlane}, &tcp); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, ReasonTenantNotFound, fmt.Errorf("spec.tenantControlPlane: TenantControlPlane %s/%s not found", h.Namespace, h.Spec.TenantControlPlane)
		}
		return nil, ReasonTenantNotReady, err
	}
	tcp.Default()
	if !meta.IsStatusConditionTrue(tcp.Status.Conditions, apiary.ConditionReady) || tcp.Status.Endpoint == "" {
		return nil, ReasonTenantNotReady, fmt.Errorf("TenantControlPlane %s is not Ready yet", tcp.Name)
	}
	var kc, ca corev1.Secret
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: h.Namespace, Name: render.SecretName(&tcp, render.SecretOperatorKubeconfig)}, &kc); err != nil {
		return nil, ReasonTenantNotReady, fmt.Errorf("reading the operator's kubeconfig for the tenant: %w", err)
	}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: h.Namespace, Name: render.SecretName(&tcp, render.SecretCA)}, &ca); err != nil {
		return nil, ReasonTenantNotReady, fmt.Errorf("reading the tenant CA: %w", err)
	}
	trust := ca.Data[render.KeyTLSCert]
	var ts corev1.Secret
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: h.Namespace, Name: render.SecretName(&tcp, render.SecretCATrust)}, &ts); err == nil {
		trust = ts.Data[render.KeyCACert]
	} else if !apierrors.IsNotFound(err) {
		return nil, ReasonTenantNotReady, fmt.Errorf("reading the tenant's CA bundle: %w", err)
	}
	tc, err := r.Tenants.For(tcp.UID, kc.Data[apiary.KubeconfigKey])
	if err != nil {
		return nil, ReasonTenantNotReady, err
	}
	cs := tc.Clientset
	return &tenantAccess{tcp: &tcp, cs: cs, caPEM: ca.Data[render.KeyTLSCert], trustPEM: trust,
		endpoint: strings.TrimPrefix(tcp.Status.Endpoint, "https://")}, "", nil
}

// caCertHash is kubeadm's discovery hash: sha256 of the CA's public key.
func caCertHash(caPEM []byte) (string, error) {
	block, _ := pem.Decode(caPEM)
	if block == nil {
		return "", errors.New("the tenant CA is not PEM")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// joinToken returns the host's bootstrap token (status.bootstrapTokenID,
// recorded before the token exists), creating it in the tenant when
// missing: a restarted operator finds and reuses it, never making a second.
func (r *HostReconciler) joinToken(ctx context.Context, h *apiary.Host, ta *tenantAccess) (string, error) {
	id := h.Status.BootstrapTokenID
	sec, err := ta.cs.CoreV1().Secrets(metav1.NamespaceSystem).Get(ctx, bootstraputil.BootstrapTokenSecretName(id), metav1.GetOptions{})
	if err == nil {
		return bootstraputil.TokenFromIDAndSecret(id, string(sec.Data[bootstrapapi.BootstrapTokenSecretKey])), nil
	}
	if !apierrors.IsNotFound(err) {
		return "", fmt.Errorf("reading bootstrap token %s: %w", id, err)
	}
	token, err := bootstraputil.GenerateBootstrapToken()
	if err != nil {
		return "", err
	}
	_, secret, _ := strings.Cut(token, ".")
	sec = &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: bootstraputil.BootstrapTokenSecretName(id), Namespace: metav1.NamespaceSystem,
			Labels: map[string]string{tenant.LabelManagedBy: tenant.ManagedBy},
		},
		Type: bootstrapapi.SecretTypeBootstrapToken,
		StringData: map[string]string{
			bootstrapapi.BootstrapTokenDescriptionKey:      fmt.Sprintf("apiary: join of Host %s/%s", h.Namespace, h.Name),
			bootstrapapi.BootstrapTokenIDKey:               id,
			bootstrapapi.BootstrapTokenSecretKey:           secret,
			bootstrapapi.BootstrapTokenExpirationKey:       r.Now().Add(joinTokenTTL).UTC().Format(time.RFC3339),
			bootstrapapi.BootstrapTokenUsageAuthentication: "true",
			bootstrapapi.BootstrapTokenUsageSigningKey:     "true",
			bootstrapapi.BootstrapTokenExtraGroupsKey:      tenant.NodeBootstrapTokenGroup,
		},
	}
	if _, err := ta.cs.CoreV1().Secrets(metav1.NamespaceSystem).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("creating bootstrap token %s: %w", id, err)
	}
	return bootstraputil.TokenFromIDAndSecret(id, secret), nil
}

// deleteJoinToken removes the host's token once it is not needed.
func (r *HostReconciler) deleteJoinToken(ctx context.Context, h *apiary.Host, ta *tenantAccess) error {
	id := h.Status.BootstrapTokenID
	if id == "" {
		return nil
	}
	err := ta.cs.CoreV1().Secrets(metav1.NamespaceSystem).Delete(ctx, bootstraputil.BootstrapTokenSecretName(id), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting bootstrap token %s: %w", id, err)
	}
	h.Status.BootstrapTokenID = ""
	return nil
}

// join makes the host a Node: a bootstrap token in the tenant, kubeadm join
// on the host, the token deleted.
func (r *HostReconciler) join(ctx context.Context, h *apiary.Host, step *apiary.HostStep) ctrl.Result {
	st := &h.Status
	fail := func(reason, msg string) ctrl.Result {
		return r.failStep(ctx, h, step, apiary.HostConditionJoined, reason, msg)
	}
	ta, reason, err := r.tenant(ctx, h)
	if err != nil {
		return fail(reason, err.Error())
	}
	hash, err := caCertHash(ta.caPEM)
	if err != nil {
		return fail(ReasonJoinFailed, err.Error())
	}
	if st.BootstrapTokenID == "" {
		// Choose the token's ID and persist it (the caller writes the
		// status) before the token exists.
		token, err := bootstraputil.GenerateBootstrapToken()
		if err != nil {
			return fail(ReasonJoinFailed, err.Error())
		}
		st.BootstrapTokenID, _, _ = strings.Cut(token, ".")
		step.Message = "bootstrap token " + st.BootstrapTokenID + " recorded"
		return ctrl.Result{Requeue: true}
	}
	token, err := r.joinToken(ctx, h, ta)
	if err != nil {
		return fail(ReasonJoinFailed, err.Error())
	}
	c, _, err := r.connect(ctx, h)
	if err != nil {
		return fail(ReasonJoinFailed, err.Error())
	}
	defer c.Close()
	joinCtx, cancel := context.WithTimeout(ctx, 6*time.Minute)
	defer cancel()
	res, err := hosts.Join(joinCtx, c, hosts.JoinRequest{Endpoint: ta.endpoint, Token: token, CACertHash: hash, NodeName: nodeName(h)})
	if err != nil {
		return fail(ReasonJoinFailed, err.Error())
	}
	if err := r.deleteJoinToken(ctx, h, ta); err != nil {
		return fail(ReasonJoinFailed, err.Error())
	}
	msg := fmt.Sprintf("kubeadm join %s as Node %s", ta.endpoint, nodeName(h))
	if res.AlreadyJoined {
		msg += " (had joined before the operator restarted)"
	}
	r.succeedStep(step, msg)
	st.NodeName = nodeName(h)
	// What kubeadm gave the kubelet: cluster-info's bundle, a client
	// certificate of the tenant's CA. During a CA rotation either may be
	// a phase behind: recorded as unknown, the rotation's steps check
	// the host.
	st.CA = &apiary.HostCA{}
	if rot := ta.tcp.Status.CARotation; rot == nil || rot.Completed != nil {
		st.CA = &apiary.HostCA{Trust: pki.Fingerprint(ta.trustPEM), KubeletIssuer: pki.Fingerprint(ta.caPEM)}
	}
	r.setCondition(h, apiary.HostConditionJoined, metav1.ConditionTrue, ReasonJoined, step.Message)
	return ctrl.Result{}
}

// nodeName is the Node a Host becomes: the Host's name.
func nodeName(h *apiary.Host) string { return h.Name }

// observeNode follows the joined Node: records its UID, applies the Host's
// labels and taints, approves its kubelet serving certificates after
// checking them against the host, and mirrors its readiness.
func (r *HostReconciler) observeNode(ctx context.Context, h *apiary.Host) ctrl.Result {
	st := &h.Status
	ta, reason, err := r.tenant(ctx, h)
	if err != nil {
		r.setCondition(h, apiary.HostConditionNodeReady, metav1.ConditionUnknown, reason, err.Error())
		return ctrl.Result{RequeueAfter: 30 * time.Second}
	}
	node, err := ta.cs.CoreV1().Nodes().Get(ctx, nodeName(h), metav1.GetOptions{})
	if err != nil {
		r.setCondition(h, apiary.HostConditionNodeReady, metav1.ConditionFalse, ReasonNodeNotFound, fmt.Sprintf("Node %s: %v", nodeName(h), err))
		return ctrl.Result{RequeueAfter: r.nodePoll(h)}
	}
	if st.NodeUID != "" && st.NodeUID != string(node.UID) {
		r.setCondition(h, apiary.HostConditionNodeReady, metav1.ConditionFalse, ReasonNodeNotFound,
			fmt.Sprintf("Node %s was re-created (UID %s, joined as %s)", node.Name, node.UID, st.NodeUID))
	}
	st.NodeName, st.NodeUID = node.Name, string(node.UID)
	if st.Version == "" {
		// Installed before Hosts recorded their version.
		st.Version = node.Status.NodeInfo.KubeletVersion
	}
	if err := r.applyNodeMetadata(ctx, h, ta, node); err != nil {
		log.FromContext(ctx).Info("applying Node labels and taints failed", "error", err.Error())
	}
	if n, err := r.approveServingCSRs(ctx, h, ta, node); err != nil {
		log.FromContext(ctx).Info("approving kubelet serving CSRs failed", "error", err.Error())
	} else if n > 0 {
		r.Recorder.Eventf(h, nil, corev1.EventTypeNormal, "ServingCertificateApproved", "ApproveCSR", "approved %d kubelet serving CSR(s) of Node %s", n, node.Name)
	}
	ready := false
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			ready = c.Status == corev1.ConditionTrue
			status := metav1.ConditionFalse
			if ready {
				status = metav1.ConditionTrue
			}
			r.setCondition(h, apiary.HostConditionNodeReady, status, c.Reason, c.Message)
		}
	}
	if ready {
		st.Phase = apiary.HostPhaseReady
		return ctrl.Result{RequeueAfter: 5 * time.Minute}
	}
	st.Phase = apiary.HostPhaseJoining
	return ctrl.Result{RequeueAfter: r.nodePoll(h)}
}

// nodePoll is how often a joined Node that is not Ready is looked at: every
// 2 s for the first 30 s after the join (the kubelet registers at once and
// a CNI already in the tenant makes the Node Ready within seconds: a
// 10 s poll was most of Host created → Ready), every 10 s until 2
// minutes, then every minute — a tenant without a pod network must not
// cost a reconcile every few seconds per host.
func (r *HostReconciler) nodePoll(h *apiary.Host) time.Duration {
	step := journalStep(&h.Status, StepJoin)
	if step == nil || step.Finished == nil {
		return 10 * time.Second
	}
	switch since := r.Now().Sub(step.Finished.Time); {
	case since < 30*time.Second:
		return 2 * time.Second
	case since < 2*time.Minute:
		return 10 * time.Second
	default:
		return time.Minute
	}
}

// Kubernetes' marks of a control-plane Node. The kubelet may not set them
// itself (NodeRestriction); the agent does, from the Host's role.
const (
	LabelNodeRoleControlPlane = "node-role.kubernetes.io/control-plane"
)

// TaintControlPlane keeps workloads off a control-plane Node, as kubeadm
// does.
var TaintControlPlane = corev1.Taint{Key: LabelNodeRoleControlPlane, Effect: corev1.TaintEffectNoSchedule}

// nodeMetadata is what the Node should carry: the Host's labels and taints,
// and for the control-plane role its label and NoSchedule taint. It
// returns the Node changed and whether it changed. A Host's own labels and
// taints are only added (those the Node has already are left as they are);
// the role's are Apiary's: a worker Host's Node loses them.
func nodeMetadata(h *apiary.Host, node *corev1.Node) (*corev1.Node, bool) {
	changed := false
	n := node.DeepCopy()
	labels := maps.Clone(h.Spec.Labels)
	taints := slices.Clone(h.Spec.Taints)
	isTaint := func(t corev1.Taint) func(corev1.Taint) bool {
		return func(x corev1.Taint) bool { return x.Key == t.Key && x.Effect == t.Effect }
	}
	if h.Spec.Role == apiary.HostRoleControlPlane {
		if labels == nil {
			labels = map[string]string{}
		}
		labels[LabelNodeRoleControlPlane] = ""
		taints = append(taints, TaintControlPlane)
	} else {
		_, own := h.Spec.Labels[LabelNodeRoleControlPlane]
		if _, ok := n.Labels[LabelNodeRoleControlPlane]; ok && !own {
			delete(n.Labels, LabelNodeRoleControlPlane)
			changed = true
		}
		if !slices.ContainsFunc(h.Spec.Taints, isTaint(TaintControlPlane)) {
			if kept := slices.DeleteFunc(slices.Clone(n.Spec.Taints), isTaint(TaintControlPlane)); len(kept) != len(n.Spec.Taints) {
				n.Spec.Taints, changed = kept, true
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		if v, ok := n.Labels[k]; !ok || v != labels[k] {
			if n.Labels == nil {
				n.Labels = map[string]string{}
			}
			n.Labels[k], changed = labels[k], true
		}
	}
	for _, t := range taints {
		if !slices.ContainsFunc(n.Spec.Taints, isTaint(t)) {
			n.Spec.Taints, changed = append(n.Spec.Taints, t), true
		}
	}
	return n, changed
}

// applyNodeMetadata gives the Node the labels and taints of nodeMetadata.
func (r *HostReconciler) applyNodeMetadata(ctx context.Context, h *apiary.Host, ta *tenantAccess, node *corev1.Node) error {
	n, changed := nodeMetadata(h, node)
	if !changed {
		return nil
	}
	_, err := ta.cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{FieldManager: FieldOwner})
	return err
}

// approveServingCSRs approves the Node's pending kubelet serving CSRs for
// the Node's name and the Host's spec address, and nothing else: not the
// addresses the kubelet reports about itself (a tenant's root on the host
// can make it report any), and never a Service or cluster-domain name.
func (r *HostReconciler) approveServingCSRs(ctx context.Context, h *apiary.Host, ta *tenantAccess, node *corev1.Node) (int, error) {
	list, err := ta.cs.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	allowedIPs := []string{h.Spec.Address}
	allowedNames := []string{node.Name}
	if reservedServingName(node.Name, ta.tcp.Spec.Network.ClusterDomain) {
		allowedNames = nil
	}
	approved := 0
	for i := range list.Items {
		csr := &list.Items[i]
		if csr.Spec.SignerName != certificatesv1.KubeletServingSignerName || csr.Spec.Username != "system:node:"+node.Name || csrDecided(csr) {
			continue
		}
		if why := checkServingCSR(csr, allowedNames, allowedIPs); why != "" {
			r.Recorder.Eventf(h, nil, corev1.EventTypeWarning, "ServingCertificateRefused", "ApproveCSR", "not approving CSR %s: %s", csr.Name, why)
			continue
		}
		csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "ApiaryHostVerified",
			Message: fmt.Sprintf("names and addresses match Host %s/%s", h.Namespace, h.Name),
		})
		if _, err := ta.cs.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{}); err != nil {
			return approved, err
		}
		approved++
	}
	return approved, nil
}

func csrDecided(csr *certificatesv1.CertificateSigningRequest) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateApproved || c.Type == certificatesv1.CertificateDenied {
			return true
		}
	}
	return false
}

// reservedServingName: names a kubelet serving certificate must never
// carry, because clients inside the tenant trust them for other servers
// (the API server's Service, any Service of the cluster domain).
func reservedServingName(name, clusterDomain string) bool {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	return name == "kubernetes" || strings.HasPrefix(name, "kubernetes.") ||
		strings.HasSuffix(name, ".svc") || strings.Contains(name, ".svc.") ||
		(clusterDomain != "" && (name == clusterDomain || strings.HasSuffix(name, "."+clusterDomain)))
}

// checkServingCSR says why a serving CSR must not be approved, or "".
func checkServingCSR(csr *certificatesv1.CertificateSigningRequest, names, ips []string) string {
	block, _ := pem.Decode(csr.Spec.Request)
	if block == nil {
		return "the request is not PEM"
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return err.Error()
	}
	if req.Subject.CommonName != csr.Spec.Username {
		return fmt.Sprintf("common name %q is not the requester %q", req.Subject.CommonName, csr.Spec.Username)
	}
	for _, d := range req.DNSNames {
		if !slices.Contains(names, d) {
			return fmt.Sprintf("DNS name %q is not the Node's name", d)
		}
	}
	for _, ip := range req.IPAddresses {
		if !slices.ContainsFunc(ips, func(s string) bool { return net.ParseIP(s).Equal(ip) }) {
			return fmt.Sprintf("IP address %s is not the Host's spec.address", ip)
		}
	}
	if len(req.EmailAddresses) > 0 || len(req.URIs) > 0 {
		return "e-mail or URI names are not allowed"
	}
	return ""
}

// cleanup runs when a Host is deleted: drain and delete its Node, reset
// the host, delete a leftover token. It returns done when the finalizer
// can go.
func (r *HostReconciler) cleanup(ctx context.Context, h *apiary.Host) (bool, ctrl.Result) {
	st := &h.Status
	fail := func(msg string) (bool, ctrl.Result) {
		r.setCondition(h, apiary.HostConditionJoined, metav1.ConditionFalse, ReasonCleanupFailed, msg)
		return false, ctrl.Result{RequeueAfter: 15 * time.Second}
	}
	if waiting := r.controlPlaneStillOn(ctx, h); waiting != "" {
		// Its tenant takes the control plane off the host first: out of
		// the Service, drained, static Pods removed. Resetting now would
		// cut the requests it serves.
		r.setCondition(h, apiary.HostConditionJoined, metav1.ConditionFalse, ReasonControlPlaneOnHost, waiting)
		return false, ctrl.Result{RequeueAfter: 5 * time.Second}
	}
	installed := journalStep(st, StepInstall) != nil
	ta, _, tenantErr := r.tenant(ctx, h)
	if ta != nil && st.NodeName != "" {
		// One eviction pass per reconcile, requeued while pods remain:
		// a drain waiting on a PodDisruptionBudget must not hold one of
		// the operator's workers for minutes.
		step := journalStep(st, StepDrain)
		if step == nil || (step.Result != StepRunning && step.Finished == nil) {
			step = r.startStep(h, StepDrain)
		}
		if step.Result == StepRunning {
			st.Phase = apiary.HostPhaseDraining
			remaining, err := r.drainOnce(ctx, ta, st.NodeName, nil)
			switch {
			case err == nil && remaining == 0:
				r.succeedStep(step, "every pod evicted from Node "+st.NodeName)
			case r.Now().Sub(step.Started.Time) >= drainTimeout:
				finished := metav1.NewTime(r.Now())
				step.Finished, step.Result = &finished, StepFailed
				step.Message = fmt.Sprintf("gave up after %s, resetting anyway: %d pods left on Node %s (%v)", drainTimeout, remaining, st.NodeName, err)
				log.FromContext(ctx).Info("drain incomplete; resetting anyway", "node", st.NodeName, "pods", remaining, "error", fmt.Sprint(err))
			default:
				step.Message = fmt.Sprintf("%d pods still on Node %s (evictions respect PodDisruptionBudgets; %v)", remaining, st.NodeName, err)
				return false, ctrl.Result{RequeueAfter: drainPoll}
			}
		}
	}
	if step := journalStep(st, StepReset); installed && (step == nil || step.Result != StepSucceeded) {
		st.Phase = apiary.HostPhaseResetting
		wait, start := r.stepDue(h.UID, step)
		switch {
		case wait > 0:
			return false, ctrl.Result{RequeueAfter: wait}
		case start:
			// In the journal before the host is touched.
			r.startStep(h, StepReset)
			return false, ctrl.Result{Requeue: true}
		}
		res, ended := r.runStep(ctx, h, step, r.resetStep)
		if step = journalStep(st, StepReset); !ended || step.Result != StepSucceeded {
			return false, res
		}
	}
	if ta != nil {
		if err := r.deleteNode(ctx, h, ta); err != nil {
			return fail(err.Error())
		}
	} else if st.NodeName != "" || st.BootstrapTokenID != "" {
		log.FromContext(ctx).Info("tenant unreachable during Host cleanup; its Node and token stay", "error", fmt.Sprint(tenantErr))
	}
	return true, ctrl.Result{}
}

// resetStep resets the host of a deleted Host, given up (with a Warning
// event saying what stays) when it can never be reached again.
func (r *HostReconciler) resetStep(ctx context.Context, h *apiary.Host, step *apiary.HostStep) ctrl.Result {
	fail := func(msg string) ctrl.Result {
		res := r.failStep(ctx, h, step, apiary.HostConditionJoined, ReasonCleanupFailed, msg)
		// Still being removed: tried again with the journal's backoff.
		h.Status.Phase = apiary.HostPhaseResetting
		return res
	}
	c, reason, err := r.connect(ctx, h)
	switch {
	case err != nil && reason == ReasonSecretNotFound, err != nil && r.namespaceGoing(ctx, h.Namespace):
		// The key is gone, or is going with the namespace: the host
		// cannot be reached again, and waiting would wedge the deletion
		// (of the namespace too). Let go, and say what stays.
		r.Recorder.Eventf(h, nil, corev1.EventTypeWarning, ReasonHostNotReset, "Cleanup",
			"the host at %s was not reset (%v): its kubelet, the node software and /etc/kubernetes stay there; run kubeadm reset -f on it", h.Spec.Address, err)
		r.succeedStep(step, "not reset: "+err.Error())
		return ctrl.Result{}
	case err != nil:
		return fail("cannot reset the host: " + err.Error() + " (remove the finalizer " + HostFinalizer + " to give up on it)")
	}
	defer c.Close()
	resetCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if _, err := hosts.Reset(resetCtx, c); err != nil {
		return fail(err.Error())
	}
	r.succeedStep(step, "kubeadm reset; the node software and its files removed")
	return ctrl.Result{}
}

// deleteNode deletes the host's Node, with a UID precondition: a Conflict
// means the Node of that name is another one (re-created behind the
// agent's back), which is left alone. Then any leftover join token.
func (r *HostReconciler) deleteNode(ctx context.Context, h *apiary.Host, ta *tenantAccess) error {
	st := &h.Status
	if st.NodeName != "" {
		opts := metav1.DeleteOptions{}
		if st.NodeUID != "" {
			uid := types.UID(st.NodeUID)
			opts.Preconditions = &metav1.Preconditions{UID: &uid}
		}
		if err := ta.cs.CoreV1().Nodes().Delete(ctx, st.NodeName, opts); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("deleting Node %s: %w", st.NodeName, err)
		}
	}
	return r.deleteJoinToken(ctx, h, ta)
}

// controlPlaneStillOn says why a Host being deleted must wait for its
// tenant to take the control plane off it ("" when it need not).
func (r *HostReconciler) controlPlaneStillOn(ctx context.Context, h *apiary.Host) string {
	var tcp apiary.TenantControlPlane
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: h.Namespace, Name: h.Spec.TenantControlPlane}, &tcp); err != nil || !tcp.DeletionTimestamp.IsZero() {
		return ""
	}
	for _, cp := range tcp.Status.ControlPlaneHosts {
		if cp.Host == h.Name && (cp.Step != apiary.HostStepStop || cp.Result != StepSucceeded) {
			return fmt.Sprintf("tenant %s runs its control plane on this host (step %s %s): waiting until it has left the Service, drained and been removed; the last serving control-plane host of a registered tenant stays until another serves or the tenant is standalone", tcp.Name, cp.Step, cp.Result)
		}
	}
	return ""
}

// namespaceGoing says whether the namespace is being deleted (its Secrets
// go with it, in no order the Host can rely on).
func (r *HostReconciler) namespaceGoing(ctx context.Context, name string) bool {
	return namespaceGoing(ctx, r.APIReader, name)
}

// namespaceGoing says whether a namespace is being deleted. The namespace
// controller then deletes its Roles as early as anything else: an operator
// confined to tenant namespaces (--tenant-namespaces) loses its rights on
// the namespace's Secrets and Deployments while the finalizers of its
// tenants and Hosts still wait for it.
func namespaceGoing(ctx context.Context, r client.Reader, name string) bool {
	var ns corev1.Namespace
	if err := r.Get(ctx, client.ObjectKey{Name: name}, &ns); err != nil {
		return apierrors.IsNotFound(err)
	}
	return !ns.DeletionTimestamp.IsZero()
}

// drainOnce cordons the Node and asks once to evict each of its pods (not
// DaemonSet or mirror pods, which the Node's deletion takes), respecting
// PodDisruptionBudgets. It returns how many remain. marks, when the Node
// is cordoned here, are added to its annotations in the same update (so
// that who cordoned it is never lost between two writes).
func (r *HostReconciler) drainOnce(ctx context.Context, ta *tenantAccess, name string, marks map[string]string) (int, error) {
	node, err := ta.cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if !node.Spec.Unschedulable {
		node.Spec.Unschedulable = true
		for k, v := range marks {
			metav1.SetMetaDataAnnotation(&node.ObjectMeta, k, v)
		}
		if _, err := ta.cs.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{FieldManager: FieldOwner}); err != nil {
			return 0, fmt.Errorf("cordoning %s: %w", name, err)
		}
	}
	pods, err := ta.cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + name})
	if err != nil {
		return 0, err
	}
	remaining := 0
	for _, p := range pods.Items {
		if isDaemonSetPod(&p) || p.Annotations[corev1.MirrorPodAnnotationKey] != "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		remaining++
		ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace}}
		if err := ta.cs.CoreV1().Pods(p.Namespace).EvictV1(ctx, ev); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsTooManyRequests(err) {
			return remaining, fmt.Errorf("evicting %s/%s: %w", p.Namespace, p.Name, err)
		}
	}
	return remaining, nil
}

func isDaemonSetPod(p *corev1.Pod) bool {
	for _, o := range p.OwnerReferences {
		if o.Kind == "DaemonSet" && o.Controller != nil && *o.Controller {
			return true
		}
	}
	return false
}
