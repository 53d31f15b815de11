// Package ovsmodel holds the libovsdb models of the Open_vSwitch database tables the OVS
// backend uses (Open_vSwitch, Bridge, Port, Interface), generated from the schema shipped
// with Debian's openvswitch-common 3.1 (copied here whole as vswitch.ovsschema; the
// generator sees only those four tables, so no model of an unused table is compiled in).
package ovsmodel

//go:generate sh -c "jq '.tables |= with_entries(select(.key | IN(\"Open_vSwitch\", \"Bridge\", \"Port\", \"Interface\")))' vswitch.ovsschema > used.ovsschema.tmp && go run github.com/ovn-org/libovsdb/cmd/modelgen -p ovsmodel -o . used.ovsschema.tmp; rc=$?; rm -f used.ovsschema.tmp; exit $rc"
