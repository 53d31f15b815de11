// Package ovsmodel holds the libovsdb models of the Open_vSwitch database, generated from
// the schema shipped with Debian's openvswitch-common 3.1 (copied here as vswitch.ovsschema).
package ovsmodel

//go:generate go run github.com/ovn-org/libovsdb/cmd/modelgen -p ovsmodel -o . vswitch.ovsschema
