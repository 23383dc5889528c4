// Package hal is the device contract: tensor element types, weights as they lie in their
// file format, activation buffers, the op set a model's forward pass needs, the optional
// ops a backend may add, and the paged KV store with its block I/O and format name.
package hal
