// Package hal is the device abstraction: tensor element types, weights as
// they lie in their file format, and the op set a model's forward pass needs.
package hal
