// RUN: pw-opt %s --verify-diagnostics --pw-place='pin=a=island9,b=island1,c=island0:3,d=island1:0,zz=island0'

// Pins that cannot be honoured, each reported at its slice (or at the module
// for a slice that does not exist).

// expected-error@below {{pin names slice @zz, which is not in this module}}
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "gpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}, unavailable = array<i64: 1>}]}} {
// An island the topology does not have.
// expected-error@below {{slice @a is pinned to island 'island9': no island named 'island9' (islands: island0, island1)}}
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
// An island that does not meet the slice's constraints.
// expected-error@below {{slice @b is pinned to island1, which cannot hold it: its devices are of kind 'gpu' (the slice needs 2 devices of kind 'cpu' in one island)}}
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {device_kind = "cpu"}} : () -> ()
// Devices past the end of the island.
// expected-error@below {{slice @c is pinned to devices [3, 5) of island0, but island0 has 4 devices}}
"pw.virtual_slice"() {sym_name = "c", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
// An unavailable device.
// expected-error@below {{slice @d is pinned to devices [0, 2) of island1, but device 1 is unavailable}}
"pw.virtual_slice"() {sym_name = "d", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
}
