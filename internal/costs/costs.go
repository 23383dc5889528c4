// Package costs reads what a benchmark costs the process and the host: its CPU time and
// the UDP datagrams sent, figures that do not depend on what else shares the machine the
// way wall time does.
package costs

import (
	"os"
	"strconv"
	"strings"
)

// UDPDatagramsSent is the host's UDP OutDatagrams counter (Linux; 0 elsewhere): a
// loopback benchmark counts both of its ends, and anything else the host sends.
func UDPDatagramsSent() int64 {
	b, err := os.ReadFile("/proc/net/snmp")
	if err != nil {
		return 0
	}
	lines := strings.Split(string(b), "\n")
	for i := 0; i+1 < len(lines); i++ {
		if !strings.HasPrefix(lines[i], "Udp:") || !strings.HasPrefix(lines[i+1], "Udp:") {
			continue
		}
		names, vals := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		for k, n := range names {
			if n == "OutDatagrams" && k < len(vals) {
				v, _ := strconv.ParseInt(vals[k], 10, 64)
				return v
			}
		}
	}
	return 0
}
