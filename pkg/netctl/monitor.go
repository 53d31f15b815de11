package netctl

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/urfave/cli/v2"
)

// monitorLine is one line of netplugin's /monitor stream.
type monitorLine struct {
	Time        time.Time `json:"time"`
	Host        string    `json:"host"`
	Reason      string    `json:"reason"`
	Proto       uint8     `json:"proto"`
	Src         string    `json:"src"`
	Dst         string    `json:"dst"`
	SrcPort     uint16    `json:"srcPort"`
	DstPort     uint16    `json:"dstPort"`
	EtherType   uint16    `json:"etherType"`
	Len         uint32    `json:"len"`
	SrcEndpoint string    `json:"srcEndpoint"`
	DstEndpoint string    `json:"dstEndpoint"`
	Network     string    `json:"network"`
	Rule        string    `json:"rule"`
	RuleEPG     uint16    `json:"ruleEPG"`
	RuleDir     string    `json:"ruleDir"`
	Lost        uint64    `json:"lost"`
	Count       uint64    `json:"count"`
	Bytes       uint64    `json:"bytes"`
}

// text is the human form: time, host, reason, both ends with names, protocol, rule.
func (l monitorLine) text() string {
	if l.Lost > 0 && l.Reason == "" {
		return fmt.Sprintf("%s %s: %d events lost (this reader was too slow)", time.Now().Format("15:04:05.000"), l.Host, l.Lost)
	}
	end := func(ip string, port uint16, name string) string {
		if ip == "" {
			return "?"
		}
		s := ip
		if port != 0 {
			s += ":" + fmt.Sprint(port)
		}
		if name != "" {
			s += " (" + name + ")"
		}
		return s
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s", l.Time.Local().Format("15:04:05.000"), l.Host, l.Reason)
	switch {
	case l.Count > 0: // counted, not copied (OVS meters): the endpoint and how much
		fmt.Fprintf(&b, " %s > %s: %d packets, %d bytes", end(l.Src, 0, l.SrcEndpoint), end(l.Dst, 0, l.DstEndpoint), l.Count, l.Bytes)
	case l.Src != "":
		fmt.Fprintf(&b, " %s > %s %s", end(l.Src, l.SrcPort, l.SrcEndpoint), end(l.Dst, l.DstPort, l.DstEndpoint), protoName(l.Proto))
	default:
		fmt.Fprintf(&b, " ethertype %#04x", l.EtherType)
	}
	if l.RuleEPG != 0 {
		rule := l.Rule
		if rule == "" {
			rule = "(rule no longer installed)"
		}
		fmt.Fprintf(&b, " rule %s (group %d %s)", rule, l.RuleEPG, l.RuleDir)
		if l.Reason == "policy_allow" {
			b.WriteString(" new flow allowed")
		}
	}
	if l.Lost > 0 {
		fmt.Fprintf(&b, " [%d events lost before this one]", l.Lost)
	}
	return b.String()
}

func protoName(p uint8) string {
	switch p {
	case 1:
		return "icmp"
	case 6:
		return "tcp"
	case 17:
		return "udp"
	}
	return fmt.Sprintf("proto %d", p)
}

// monitorCommand is `netctl monitor`: the dropped packets of one or more hosts as they
// happen, from their netplugins.
func monitorCommand() *cli.Command {
	return &cli.Command{
		Name: "monitor", Usage: "Stream dropped packets (with the rule that denied them) from hosts' netplugins", ArgsUsage: " ",
		Flags: []cli.Flag{
			&cli.StringSliceFlag{Name: "agent", Aliases: []string{"host"}, Value: cli.NewStringSlice(DefaultAgent), EnvVars: []string{"CONTIV_AGENT"},
				Usage: "`URL` of a host's netplugin inspect API; repeat for several hosts"},
			allHostsFlag(),
			&cli.StringFlag{Name: "endpoint", Aliases: []string{"e"}, Usage: "only packets from or to this endpoint (id substring or address)"},
			&cli.StringFlag{Name: "tenant", Usage: "only packets of this tenant's networks"},
			&cli.StringFlag{Name: "reason", Aliases: []string{"r"}, Usage: "only drops whose reason contains this (e.g. policy)"},
			&cli.BoolFlag{Name: "policy", Usage: "only policy verdicts"},
			&cli.BoolFlag{Name: "allowed", Usage: "also new flows a rule allowed (policy_allow, with the rule)"},
			&cli.IntFlag{Name: "count", Aliases: []string{"n"}, Usage: "stop after this many events (0: until interrupted)"},
			&cli.DurationFlag{Name: "duration", Usage: "stop after this long (0: until interrupted)"},
			jsonFlag(),
		},
		Action: runMonitor,
	}
}

func runMonitor(c *cli.Context) error {
	if c.NArg() != 0 {
		return usageErr(c, "%s", "More arguments than required")
	}
	q := url.Values{}
	for _, k := range []string{"endpoint", "tenant", "reason"} {
		if v := c.String(k); v != "" {
			q.Set(k, v)
		}
	}
	if c.Bool("policy") {
		q.Set("policy", "1")
	}
	if c.Bool("allowed") {
		q.Set("allowed", "1")
	}
	ctx := c.Context
	if d := c.Duration("duration"); d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	agents, err := hostAgents(c)
	if err != nil {
		return err
	}
	lines := make(chan monitorLine, 256)
	// Open every stream first (each within --timeout, at most 5 s: agents answer the headers
	// at once), so an unreachable host is reported as down whatever arrives from the others,
	// then stream the ones that answered.
	openWait := min(c.Duration("timeout"), 5*time.Second)
	streams := make([]*http.Response, len(agents))
	errs := make([]error, len(agents))
	var open sync.WaitGroup
	for i, base := range agents {
		open.Add(1)
		go func() {
			defer open.Done()
			octx, cancel := context.WithTimeout(ctx, openWait)
			defer cancel()
			streams[i], errs[i] = openMonitor(octx, ctx, agentHTTP(c, 0), base+"/monitor?"+q.Encode())
		}()
	}
	open.Wait()
	var wg sync.WaitGroup
	var mu sync.Mutex
	failed := 0
	for i, base := range agents {
		if errs[i] != nil {
			fmt.Fprintf(c.App.ErrWriter, "%s: down: %v\n", base, errs[i])
			failed++
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := readMonitor(ctx, streams[i], lines); err != nil && ctx.Err() == nil {
				fmt.Fprintf(c.App.ErrWriter, "%s: down: %v\n", base, err)
				mu.Lock()
				failed++
				mu.Unlock()
			}
		}()
	}
	go func() { wg.Wait(); close(lines) }()
	n, limit := 0, c.Int("count")
	for l := range lines {
		if c.Bool("json") {
			b, _ := json.Marshal(l)
			fmt.Fprintln(c.App.Writer, string(b))
		} else {
			fmt.Fprintln(c.App.Writer, l.text())
		}
		if l.Reason != "" {
			n++
		}
		if limit > 0 && n >= limit {
			stop()
			break
		}
	}
	stop()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if failed == len(agents) {
		return &exitError{code: ExitAPI, msg: "no netplugin could be monitored"}
	}
	return nil
}

// openMonitor connects to one agent's stream: octx bounds the connection and the answer's
// headers, ctx (the whole monitor's) the stream after them.
func openMonitor(octx, ctx context.Context, hc *http.Client, u string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	type answer struct {
		resp *http.Response
		err  error
	}
	got := make(chan answer, 1)
	// No client timeout: the stream is open-ended; ctx ends it.
	go func() {
		resp, err := hc.Do(req)
		got <- answer{resp, err}
	}()
	select {
	case a := <-got:
		if a.err != nil {
			return nil, a.err
		}
		if a.resp.StatusCode != http.StatusOK {
			defer a.resp.Body.Close()
			b, _ := io.ReadAll(io.LimitReader(a.resp.Body, 4096))
			return nil, fmt.Errorf("%s: %s", a.resp.Status, strings.TrimSpace(string(b)))
		}
		return a.resp, nil
	case <-octx.Done():
		go func() { // the request goes on until ctx ends; close what it may still return
			if a := <-got; a.resp != nil {
				a.resp.Body.Close()
			}
		}()
		return nil, fmt.Errorf("no answer within the timeout: %w", octx.Err())
	}
}

// readMonitor copies one agent's stream into out until ctx ends or the stream does.
func readMonitor(ctx context.Context, resp *http.Response, out chan<- monitorLine) error {
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var l monitorLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return fmt.Errorf("bad line %q: %w", sc.Text(), err)
		}
		select {
		case out <- l:
		case <-ctx.Done():
			return nil
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return fmt.Errorf("stream ended")
}
