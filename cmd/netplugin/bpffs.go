package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ensureBPFFS mounts bpffs at /sys/fs/bpf when nothing is mounted there yet (as Cilium's
// agent does), so pins under --bpffs-root survive netplugin restarts.
func ensureBPFFS(root string) error {
	base := "/sys/fs/bpf"
	if rel, err := filepath.Rel(base, root); err != nil || rel == ".." || len(rel) >= 2 && rel[:2] == ".." {
		return nil // a root elsewhere is the operator's business
	}
	var st unix.Statfs_t
	if err := unix.Statfs(base, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", base, err)
	}
	if st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", base, err)
	}
	if err := unix.Mount("bpf", base, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs on %s: %w", base, err)
	}
	slog.Info("mounted bpffs", "path", base)
	return nil
}
