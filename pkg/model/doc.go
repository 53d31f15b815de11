// Package model owns the Go types that cross netmaster's boundaries with Contiv's exact JSON
// names: the REST model objects (/api/v1/<collection>/), their inspect Oper views, the derived
// /contiv.io/state and /contiv.io/oper records that agents consume, the /plugin/* request and
// response bodies, the key/id helpers and the jainvipin/bitset JSON encoding.
//
// It knows nothing about HTTP, etcd or dataplanes; it is pure data plus small helpers.
package model
