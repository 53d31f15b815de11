package cniplugin

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
)

// TestAddReportsFailedRollback: when netplugin cannot be reached, ADD fails with "try
// again later" and its details also say that the rollback detach failed (that error
// used to be dropped).
func TestAddReportsFailedRollback(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "absent.sock")
	err := Plugin{}.Add(&skel.CmdArgs{
		ContainerID: "cbx-undo",
		Netns:       "/proc/self/ns/net",
		IfName:      "eth0",
		StdinData:   []byte(`{"cniVersion":"1.0.0","name":"n","type":"contivk8s","socket":"` + sock + `","timeoutSeconds":2}`),
	})
	var te *types.Error
	if !errors.As(err, &te) {
		t.Fatalf("Add err = %v (%T), want a *types.Error", err, err)
	}
	if te.Code != types.ErrTryAgainLater {
		t.Errorf("code = %d, want %d (try again later)", te.Code, types.ErrTryAgainLater)
	}
	if !strings.Contains(te.Details, "rollback: detach pod cbx-undo") {
		t.Errorf("details %q do not report the failed rollback", te.Details)
	}
}
