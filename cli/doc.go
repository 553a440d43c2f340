// Package cli implements the user-facing commands of the apiary binary:
// "apiary status" and "apiary kubeconfig" read TenantControlPlanes and their
// admin kubeconfig Secrets from the management cluster with the user's own
// kubeconfig, and "apiary version" prints the build version.
//
// The formatting of tables and details is done by pure functions (FormatTable,
// FormatDetail, ...) so that it can be tested without a cluster; the command
// constructors (NewStatusCommand, NewKubeconfigCommand, NewVersionCommand) wire
// them to cobra and to a controller-runtime client.
package cli
