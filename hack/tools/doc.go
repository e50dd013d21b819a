// Package tools pins the code generators the Makefile runs, in a module of
// their own so that their dependencies stay out of the product's go.mod.
package tools
