// RUN: pw-opt %s --split-input-file --verify-diagnostics --pw-verify-phase=phase=lowered
// RUN: not pw-opt %s --split-input-file --pw-verify-phase=phase=lowered 2>&1 | FileCheck %s --check-prefix=LOCATION

// Each case is a placed module that is not lowered: the lowered phase's rule
// is that every operand lives where it is used (pw-insert-transfers moves
// the others), so no mark records it.

// LOCATION: verify-phase-lowered-invalid.mlir:21:8: error: 'pw.compute' op operand #0 lives on @v0 with sharding {{.*}}, but the op uses it on @v0 with sharding {{.*}}: the lowered phase requires every operand where it is used (pw-insert-transfers moves it)

// Another sharding on the same slice, and another slice.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "v1", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }
}
func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> attributes {pw.program} {
  %0 = "pw.compute"(%a) {callee = @f, slice = @v0, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0"} : (tensor<4xf32>) -> tensor<4xf32>
  // expected-error@below {{'pw.compute' op operand #0 lives on @v0 with sharding [["x"]], but the op uses it on @v0 with sharding [[]]}}
  %1 = "pw.compute"(%0) {callee = @f, slice = @v0, in_shardings = [[[]]], out_shardings = [[["x"]]], label = "f#1"} : (tensor<4xf32>) -> tensor<4xf32>
  // expected-error@below {{'pw.compute' op operand #0 lives on @v0 with sharding [["x"]], but the op uses it on @v1 with sharding [["x"]]}}
  %2 = "pw.compute"(%1) {callee = @f, slice = @v1, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#2"} : (tensor<4xf32>) -> tensor<4xf32>
  return %2 : tensor<4xf32>
}
}

// -----

// A program argument the runtime puts on @v0 (pw.home) is used on @v1.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "v1", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }
}
func.func @main(%a: tensor<4xf32> {pw.home = {slice = @v0, sharding = [["x"]]}}) -> tensor<4xf32> attributes {pw.program} {
  // expected-error@below {{'pw.compute' op operand #0 lives on @v0 with sharding [["x"]], but the op uses it on @v1 with sharding [["x"]]}}
  %0 = "pw.compute"(%a) {callee = @f, slice = @v1, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0"} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
}
