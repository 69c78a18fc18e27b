package wan

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// openTUN creates a TUN device named name (IPv4 packets without a header, IFF_NO_PI) in the
// caller's namespace and returns its file, read and written through Go's poller. The device
// is not persistent: it goes away when the file is closed or the process dies, even after it
// was moved into another namespace.
func openTUN(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun for %s: %w", name, err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("tun %s: %w", name, err)
	}
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("create tun %s (TUNSETIFF): %w", name, err)
	}
	return os.NewFile(uintptr(fd), "tun:"+name), nil
}
