package netctl

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// TestAgentToken: the commands that talk to netplugins send --agent-token
// ($CONTIV_AGENT_TOKEN) as a bearer token, never netmaster's --token, and follow no
// redirect (the token would go wherever one points).
func TestAgentToken(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, "elsewhere "+r.Header.Get("Authorization"))
		mu.Unlock()
		http.Error(w, "nothing here", http.StatusNotFound)
	}))
	defer elsewhere.Close()
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.URL.Path+" "+r.Header.Get("Authorization"))
		mu.Unlock()
		if r.URL.Path == "/inspect/bpf/peers" {
			http.Redirect(w, r, elsewhere.URL+"/steal", http.StatusFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"columns":["a"],"rows":[["1"]]}`))
	}))
	defer agent.Close()
	_, master := startCanned(t, fixture)

	r := runNetctl(t, master, "--token", "master-token-0123456789", "--agent-token", "agent-token-0123456789", "bpf", "endpoints", "--agent", agent.URL)
	if r.code != 0 {
		t.Fatalf("bpf endpoints: exit %d: %s", r.code, r.stderr)
	}
	r = runNetctl(t, master, "--agent-token", "agent-token-0123456789", "bpf", "peers", "--agent", agent.URL)
	if r.code == 0 {
		t.Errorf("bpf peers answered by a redirect: exit 0\n%s", r.stdout)
	}
	r = runNetctl(t, master, "--token", "master-token-0123456789", "bpf", "endpoints", "--agent", agent.URL)
	if r.code != 0 {
		t.Fatalf("bpf endpoints without --agent-token: exit %d: %s", r.code, r.stderr)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"/inspect/bpf/endpoints Bearer agent-token-0123456789", "/inspect/bpf/peers Bearer agent-token-0123456789", "/inspect/bpf/endpoints "}
	if strings.Join(seen, "\n") != strings.Join(want, "\n") {
		t.Errorf("requests seen:\n%s\nwant:\n%s", strings.Join(seen, "\n"), strings.Join(want, "\n"))
	}
}
