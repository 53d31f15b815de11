package master

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"
)

const (
	octet    = `(25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)`
	ip4      = octet + `\.` + octet + `\.` + octet + `\.` + octet
	nameBody = `(([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9\-]*[a-zA-Z0-9])\.)*([A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9\-]*[A-Za-z0-9])`
)

var (
	reName      = regexp.MustCompile(`^` + nameBody + `$`)
	reIP4       = regexp.MustCompile(`^` + ip4 + `$`)
	reSubnet    = regexp.MustCompile(`^` + ip4 + `(-` + ip4 + `)?/([1-9]|[12][0-9]|3[01])$`)
	reIPPool    = regexp.MustCompile(`^` + ip4 + `(-` + ip4 + `)?$`)
	reRuleIP    = regexp.MustCompile(`^` + ip4 + `(-` + octet + `)?(/([1-9]|[12][0-9]|3[0-2]))?$`)
	reProtocol  = regexp.MustCompile(`^(tcp|udp|icmp||[0-9]{1,3}?)$`)
	reVlanRange = regexp.MustCompile(`^([0-9]{1,4}?-[0-9]{1,4}?)$`)
	reVxlanRng  = regexp.MustCompile(`^([0-9]{1,8}?-[0-9]{1,8}?)$`)
	rePvtSubnet = regexp.MustCompile(`^` + ip4 + `/16$`)
	reRouterIP  = regexp.MustCompile(`^` + ip4 + `/([0-9]|[12][0-9]|3[0-2])$`)
	rePath      = regexp.MustCompile(`^topology/pod-[0-9]{1,4}/paths-[0-9]{1,4}/pathep-\[eth[0-9]{1,2}/[0-9]{1,2}\]$`)
	reNode      = regexp.MustCompile(`^topology/pod-[0-9]{1,4}/node-[0-9]{1,4}$`)
)

// maxListEntries bounds a list of names or ports stored whole with its object (a group's
// policies and external contracts groups, an app profile's groups, a service's ports):
// without it only the 1 MiB body limit bounded them (20,000 copies of one group name in
// an app profile were accepted and stored).
const maxListEntries = 1024

// checkListLen refuses a list of more than max entries, naming the field.
func checkListLen(field string, n, max int) error {
	if n > max {
		return badReq("%s: %d entries, at most %d", field, n, max)
	}
	return nil
}

// checkNames bounds a list of object names and checks each (at most max bytes).
func checkNames(field string, names []string, max int) error {
	if err := checkListLen(field, len(names), maxListEntries); err != nil {
		return err
	}
	for _, n := range names {
		if err := checkName(field, n, max); err != nil {
			return err
		}
	}
	return nil
}

// field checks: each returns a 400 naming the field.

func checkName(field, v string, max int) error {
	if len(v) > max {
		return badReq("%s: %q is longer than %d characters", field, v, max)
	}
	if !reName.MatchString(v) {
		return badReq("%s: %q is not a valid name (letters, digits, '-' and '.', starting and ending with a letter or digit)", field, v)
	}
	return nil
}

func checkOptName(field, v string, max int) error {
	if v == "" {
		return nil
	}
	return checkName(field, v, max)
}

func checkRegex(field, v string, re *regexp.Regexp, what string, max int) error {
	if max > 0 && len(v) > max {
		return badReq("%s: %q is longer than %d characters", field, v, max)
	}
	if !re.MatchString(v) {
		return badReq("%s: %q is not %s", field, v, what)
	}
	return nil
}

// reContract is an external contract's name or ACI distinguished name (tn-common/brc-web,
// uni/tn-t1/brc-db): printable, no spaces.
var reContract = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:/\-]*$`)

// Bounds of an external contracts group's list (each entry at most maxContractLen).
const (
	maxContracts   = 256
	maxContractLen = 255
)

// checkContracts bounds and checks an external contracts group's contracts: a free-form
// list stored whole with the group (a 1 MB list rewritten in a loop filled etcd's quota
// in seconds).
func checkContracts(field string, cs []string) error {
	if len(cs) > maxContracts {
		return badReq("%s: %d contracts, at most %d", field, len(cs), maxContracts)
	}
	seen := map[string]bool{}
	for i, c := range cs {
		if err := checkRegex(fmt.Sprintf("%s[%d]", field, i), c, reContract, "a contract name (letters, digits, '_', '.', ':', '/', '-')", maxContractLen); err != nil {
			return err
		}
		if seen[c] {
			return badReq("%s[%d]: %q is listed twice", field, i, c)
		}
		seen[c] = true
	}
	return nil
}

func checkOneOf(field, v string, allowed ...string) error {
	for _, a := range allowed {
		if v == a {
			return nil
		}
	}
	return badReq("%s: %q must be one of %s", field, v, strings.Join(quoteAll(allowed), ", "))
}

func quoteAll(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = strconv.Quote(v)
	}
	return out
}

func checkIntRange(field string, v, lo, hi int) error {
	if v < lo || v > hi {
		return badReq("%s: %d is out of range %d..%d", field, v, lo, hi)
	}
	return nil
}

// parseRange parses "a-b" with a ≤ b.
func parseRange(field, s string) (int, int, error) {
	lo, hi, ok := strings.Cut(s, "-")
	a, err1 := strconv.Atoi(lo)
	b, err2 := strconv.Atoi(hi)
	if !ok || err1 != nil || err2 != nil {
		return 0, 0, badReq("%s: %q is not a range like 1-4094", field, s)
	}
	if a > b {
		return 0, 0, badReq("%s: %q has its start after its end", field, s)
	}
	return a, b, nil
}

func fmtRange(a, b int) string { return fmt.Sprintf("%d-%d", a, b) }

// maxPluginField bounds plugin-route strings that become parts of etcd keys or reach
// every agent (container ids, host names, endpoint ids, names).
const maxPluginField = 256

// checkPluginFields refuses plugin-route values (names and ids; addresses are parsed by
// their own checks) that are too long or could change which
// key they name: control characters (NUL included), '/', "..", and backslashes. Empty
// values are left to the route's own required-field checks.
func checkPluginFields(fields map[string]string) error {
	if err := checkTextFields(fields, maxPluginField); err != nil {
		return err
	}
	for _, k := range sortedKeys(fields) {
		if v := fields[k]; strings.Contains(v, "..") || strings.ContainsAny(v, "/\\") {
			return badReq("%s: %q must not contain '/', '\\' or '..'", k, v)
		}
	}
	return nil
}

// checkTextFields refuses a field longer than max bytes or holding a control character.
func checkTextFields(fields map[string]string, max int) error {
	for _, k := range sortedKeys(fields) {
		v := fields[k]
		if len(v) > max {
			return badReq("%s: %d bytes, at most %d", k, len(v), max)
		}
		for _, r := range v {
			if r < 0x20 || r == 0x7f {
				return badReq("%s: control character %U is not allowed", k, r)
			}
		}
	}
	return nil
}

func sortedKeys(m map[string]string) []string {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	sortStrings(names)
	return names
}

// Bounds of the labels kept of an endpoint (updateEndpoint): they are copied into every
// service record whose selector they match, so their size multiplies. Kubernetes' label keys fit
// (a 253-byte prefix, '/', a 63-byte name), and so do Docker's labels of any reasonable
// size.
const (
	maxLabels        = 256
	maxLabelKeyBytes = 317
	maxLabelValBytes = 4096
	maxLabelsBytes   = 64 << 10
)

// usableLabels returns the labels a selector can name within the bounds, and a note
// naming what it left out (empty: nothing). What it leaves out: every label once there
// are too many or too many bytes in all (none is kept over another), an empty or too long
// key, a too long value, '=' or ',' in a key (selectors are "key=value" lists), control
// characters in a key, a NUL, invalid UTF-8 or a control character other than tab,
// newline and carriage return in a value (Docker's labels may span lines). Labels come
// with a container, image labels of any size included (buildpacks' JSON metadata): the
// endpoint's other updates (its DNS name, the services its other labels select) never
// fail for them.
func usableLabels(labels map[string]string) (map[string]string, string) {
	total := 0
	for k, v := range labels {
		total += len(k) + len(v)
	}
	if len(labels) > maxLabels || total > maxLabelsBytes {
		return nil, fmt.Sprintf("all %d labels left out: at most %d labels and %d bytes in all (%d)", len(labels), maxLabels, maxLabelsBytes, total)
	}
	out := make(map[string]string, len(labels))
	var dropped []string
	for k, v := range labels {
		if labelProblem(k, v) != "" {
			dropped = append(dropped, k)
			continue
		}
		out[k] = v
	}
	if len(dropped) == 0 {
		return out, ""
	}
	sortStrings(dropped)
	return out, fmt.Sprintf("labels left out (a key of 1-%d bytes without '=', ',' or control characters, a value of at most %d bytes): %q",
		maxLabelKeyBytes, maxLabelValBytes, dropped)
}

// labelProblem says what keeps label k=v from being used ("": nothing).
func labelProblem(k, v string) string {
	switch {
	case k == "" || len(k) > maxLabelKeyBytes:
		return "key length"
	case strings.ContainsAny(k, "=,"):
		return "key character"
	case len(v) > maxLabelValBytes:
		return "value length"
	case !utf8.ValidString(k) || !utf8.ValidString(v):
		return "utf-8"
	}
	for _, r := range k {
		if r < 0x20 || r == 0x7f {
			return "key control character"
		}
	}
	for _, r := range v {
		if (r < 0x20 && r != '\t' && r != '\n' && r != '\r') || r == 0x7f {
			return "value control character"
		}
	}
	return ""
}
