// Package doctor checks whether a machine can run a config's node: the interpreter and
// torch, CUDA and the device, free disk, memory, /dev/shm, the ports, and the bootstrap
// peers. Each failed check says how to fix it. It changes nothing: the only side effects
// are running the interpreter once and binding each fixed port for an instant.
package doctor
