package ovs

import (
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestUnixctl talks to a stand-in control socket that answers like vswitchd: a result,
// an error, and a connection closed without a reply.
func TestUnixctl(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "ctl")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			var req struct {
				ID     int      `json:"id"`
				Method string   `json:"method"`
				Params []string `json:"params"`
			}
			if err := json.NewDecoder(c).Decode(&req); err != nil {
				c.Close()
				continue
			}
			switch req.Method {
			case "echo":
				_ = json.NewEncoder(c).Encode(map[string]any{"id": req.ID, "result": strings.Join(req.Params, " "), "error": nil})
			case "hangup":
			default:
				_ = json.NewEncoder(c).Encode(map[string]any{"id": req.ID, "result": nil, "error": `"` + req.Method + `" is not a valid command`})
			}
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if out, err := unixctl(ctx, sock, "echo", "a", "b"); err != nil || out != "a b" {
		t.Errorf("echo: %q, %v", out, err)
	}
	if _, err := unixctl(ctx, sock, "bogus/cmd"); err == nil || !strings.Contains(err.Error(), "not a valid command") {
		t.Errorf("unknown command: %v", err)
	}
	if _, err := unixctl(ctx, sock, "hangup"); err == nil {
		t.Error("no reply: no error")
	}
	if _, err := unixctl(ctx, filepath.Join(t.TempDir(), "none"), "echo"); err == nil {
		t.Error("missing socket: no error")
	}
}
