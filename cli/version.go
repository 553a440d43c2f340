package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// BuildVersion is version, or when it is the "dev" default, the module
// version Go recorded in the binary (for "go install ...@vX.Y.Z").
func BuildVersion(version string) string {
	if version != "dev" && version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// NewVersionCommand returns "apiary version".
func NewVersionCommand(version string) *cobra.Command {
	var short bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version of apiary",
		Long: `Print the version of this apiary binary, with the Go version and platform it
was built for. Release builds set the version with
-ldflags "-X main.version=vX.Y.Z"; other builds say "dev".`,
		Example: `  apiary version
  apiary version --short`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := BuildVersion(version)
			if short {
				_, err := fmt.Fprintln(cmd.OutOrStdout(), v)
				return err
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "apiary version %s (%s %s/%s)\n", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
			return err
		},
	}
	cmd.Flags().BoolVar(&short, "short", false, "print only the version")
	return cmd
}
