package costs

import (
	"net"
	"runtime"
	"testing"
)

func TestCosts(t *testing.T) {
	if runtime.GOOS == "windows" || runtime.GOOS == "plan9" {
		t.Skip("the process's CPU time is read with getrusage, which only Unix has")
	}
	before := ProcessCPU()
	x := 0
	for i := range 20_000_000 {
		x += i % 7
	}
	if ProcessCPU() <= before || x == 0 {
		t.Errorf("a busy loop took no CPU: %v then %v", before, ProcessCPU())
	}
	if runtime.GOOS != "linux" {
		t.Skip("UDP counters are read from Linux's /proc/net/snmp")
	}
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sent := UDPDatagramsSent()
	for range 10 {
		c.WriteTo([]byte("x"), c.LocalAddr())
	}
	if got := UDPDatagramsSent() - sent; got < 10 {
		t.Errorf("%d datagrams counted after sending 10", got)
	}
}
