// RUN: pw-opt %s --split-input-file --verify-diagnostics --pw-place
// RUN: not pw-opt %s --pw-place=strategy=fair 2>&1 | FileCheck %s --check-prefix=STRATEGY
// RUN: not pw-opt %s --pw-place=pin=a 2>&1 | FileCheck %s --check-prefix=PIN
// RUN: not pw-opt %s --pw-place=topology=%t.missing.json 2>&1 | FileCheck %s --check-prefix=FILE
// RUN: %python -c "open(r'%t.nul.json', 'wb').write(bytes([123, 0, 125]))"
// RUN: not pw-opt %s --pw-lower=topology=%t.nul.json 2>&1 | FileCheck %s --check-prefix=NUL

// Each case is a slice (or module) pw-place cannot place.

// STRATEGY: option 'strategy' of 'pw-place' takes auto, spread or pack, not 'fair'
// PIN: pin 'a' of 'pw-place' must be slice=island or slice=island:first_device
// FILE: missing.json: cannot read topology: No such file or directory
// A topology file's error at its place is that one line, in the form of every such error.
// NUL: {{^[^ ]*}}nul.json:1:2: error: topology contains a NUL byte{{$}}

// A slice larger than any island: the error says what it needs and what is free.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}, unavailable = array<i64: 3>}]}} {
// expected-error@below {{cannot place slice @big: it needs 8 devices in one island; free: island0 has 3 of 4 devices available (cpu, 1024 bytes each)}}
"pw.virtual_slice"() {sym_name = "big", shape = array<i64: 2, 4>, axes = ["x", "y"], constraints = {}} : () -> ()
}

// -----

// Constraints no island meets.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
// expected-error@below {{cannot place slice @t: it needs 2 devices of kind 'tpu' with at least 4096 bytes each in island 'island0'; free: island0 has 4 of 4}}
"pw.virtual_slice"() {sym_name = "t", shape = array<i64: 2>, axes = ["x"], constraints = {device_kind = "tpu", min_memory_bytes = 4096, island = "island0"}} : () -> ()
}

// -----

// An island the topology does not have.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
// expected-error@below {{cannot place slice @t: it asks for island 'island7', which the topology does not have (islands: island0)}}
"pw.virtual_slice"() {sym_name = "t", shape = array<i64: 2>, axes = ["x"], constraints = {island = "island7"}} : () -> ()
}

// -----

// No topology: neither an option nor the module's pw.topology.
// expected-error@below {{pw-place needs a topology}}
module {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
}

// -----

// No topology, and no module op written: the error is at the module the parser makes, which has no line.
// expected-error@unknown {{pw-place needs a topology}}
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()

// -----

// A malformed pw.topology.
// expected-error@below {{pw.topology: islands[0]: missing 'hosts'}}
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
}

// -----

// Buffers no device can hold (a 2^40 x 16 input): the error, at the computation,
// names the bytes, the computation, the value and the slice.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 2147483648, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
module @tanh attributes {pw.executable} {
  func.func public @main(%x: tensor<1099511627776x16xf32>) -> tensor<1099511627776x16xf32> {
    %0 = "stablehlo.tanh"(%x) : (tensor<1099511627776x16xf32>) -> tensor<1099511627776x16xf32>
    return %0 : tensor<1099511627776x16xf32>
  }
}
func.func @huge(%x: tensor<1099511627776x16xf32>) -> tensor<1099511627776x16xf32> attributes {pw.program} {
  // expected-error@below {{cannot place slice @a: computation 'huge#0' needs 70368744177664 bytes per device for its operands and results (value %arg0 (tensor<1099511627776x16xf32>) alone is 35184372088832 bytes per device), but no island's devices have more than 2147483648 bytes}}
  %0 = "pw.compute"(%x) {callee = @tanh, slice = @a, in_shardings = [[["x"], []]], out_shardings = [[["x"], []]], label = "huge#0"} : (tensor<1099511627776x16xf32>) -> tensor<1099511627776x16xf32>
  return %0 : tensor<1099511627776x16xf32>
}
}

// -----

// An elastic slice no shape of whose range fits: the error says the range it needs.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}, unavailable = array<i64: 1, 2, 3>}]}} {
// expected-error@below {{cannot place slice @d: it needs 2 to 8 devices in one island; free: island0 has 1 of 4 devices available (cpu, 1024 bytes each)}}
"pw.virtual_slice"() {sym_name = "d", shape = array<i64: 8>, axes = ["data"], constraints = {min_shape = array<i64: 2>}} : () -> ()
}

// -----

// pw-place reads only verified input: a sharding that names an axis its
// slice does not have is pw-verify's error, reported before placement.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["y"], constraints = {}} : () -> ()
module @tanh attributes {pw.executable} {
  func.func public @main(%x: tensor<64x16xf32>) -> tensor<64x16xf32> {
    %0 = "stablehlo.tanh"(%x) : (tensor<64x16xf32>) -> tensor<64x16xf32>
    return %0 : tensor<64x16xf32>
  }
}
func.func @big(%x: tensor<64x16xf32>) -> tensor<64x16xf32> attributes {pw.program} {
  // expected-error@below {{sharding [["x"], []] names axis 'x' which the slice does not have (axes: y)}}
  %a = "pw.compute"(%x) {callee = @tanh, slice = @a, in_shardings = [[["x"], []]], out_shardings = [[["y"], []]], label = "a#0"} : (tensor<64x16xf32>) -> tensor<64x16xf32>
  return %a : tensor<64x16xf32>
}
}

// -----

// A module pw-insert-transfers has lowered already (its argument has a home):
// placing it again moved its slices to other islands, and left the transfers
// it had written for the old placement (an ICI link now crossing islands).
// expected-error@below {{pw-place runs on programs before pw-insert-transfers moves their values for a placement, but this module's are moved already (it holds pw.home marks or plans): place the module as it was before lowering}}
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {devices = array<i64: 0, 2>, island = "island0"}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32> {pw.home = {slice = @a, sharding = [["x"]]}}) -> tensor<8xf32> attributes {pw.program} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0"} : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
}
