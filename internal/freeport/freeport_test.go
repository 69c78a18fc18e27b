package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestTCPIsFreeToListenOn(t *testing.T) {
	p, err := TCP()
	if err != nil {
		t.Fatal(err)
	}
	if p <= 0 || p > 65535 {
		t.Fatalf("port %d", p)
	}
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	if err != nil {
		t.Fatalf("listen on the port TCP returned: %v", err)
	}
	l.Close()
}
