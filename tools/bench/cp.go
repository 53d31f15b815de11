package main

import (
	"context"
	"errors"
	"io"
)

// cpStage measures the control plane through pkg/cpbench.
func cpStage(ctx context.Context, cfg config, w io.Writer, r *report) error {
	return errors.New("pkg/cpbench is not in this tree yet")
}
