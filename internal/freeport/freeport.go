// Package freeport finds a TCP port on the loopback interface that nothing listens on, for
// the processes the demo and the scale benchmark start.
package freeport

import "net"

// TCP returns a loopback TCP port that was free a moment ago: the caller hands it to a
// child process, which may lose a race for it to another process (the child then fails to
// listen and says so).
func TCP() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
