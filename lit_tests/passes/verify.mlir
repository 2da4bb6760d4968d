// RUN: pw-opt %s --split-input-file --pw-verify | FileCheck %s

// pw-verify accepts well-formed programs and leaves them unchanged.

// A program over two slices, device-agnostic: values cross slices implicitly
// (pw-insert-transfers makes the movement explicit later).
// CHECK-LABEL: func.func @two_slices
// CHECK: "pw.compute"(%arg0) {callee = @f, {{.*}}slice = @v0}
// CHECK: "pw.compute"(%0) {callee = @f, {{.*}}slice = @v1}
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
"pw.virtual_slice"() {sym_name = "v1", shape = array<i64: 2, 2>, axes = ["a", "b"], constraints = {island = "island1"}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%a: tensor<4x4xf32>) -> tensor<4x4xf32> { return %a : tensor<4x4xf32> }
}
func.func @two_slices(%a: tensor<4x4xf32>) -> tensor<4x4xf32> attributes {pw.program} {
  %0 = "pw.compute"(%a) {callee = @f, slice = @v0, in_shardings = [[["x"], []]], out_shardings = [[["x"], []]], label = "f#0"} : (tensor<4x4xf32>) -> tensor<4x4xf32>
  %1 = "pw.compute"(%0) {callee = @f, slice = @v1, in_shardings = [[["a"], ["b"]]], out_shardings = [[["a", "b"], []]], label = "f#1"} : (tensor<4x4xf32>) -> tensor<4x4xf32>
  return %1 : tensor<4x4xf32>
}

// -----

// Lowered: every cross-slice use goes through data movement that arrives on
// the consumer's slice in the consumer's sharding.
// CHECK-LABEL: func.func @lowered
// CHECK: "pw.transfer"
// CHECK: "pw.scatter"
// CHECK: "pw.gather"
module {
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "v1", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 0, 1, 3, 4>}} : () -> ()
"pw.virtual_slice"() {sym_name = "v2", shape = array<i64: 4>, axes = ["y"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 4, 8>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%a: tensor<8xf32>) -> tensor<8xf32> { return %a : tensor<8xf32> }
}
func.func @lowered(%a: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  %0 = "pw.compute"(%a) {callee = @f, slice = @v0, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0"} : (tensor<8xf32>) -> tensor<8xf32>
  %1 = "pw.transfer"(%0) {link = "dcn", src = @v0, dst = @v1, sharding = [["x"]]} : (tensor<8xf32>) -> tensor<8xf32>
  %2 = "pw.compute"(%1) {callee = @f, slice = @v1, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#1"} : (tensor<8xf32>) -> tensor<8xf32>
  %3 = "pw.scatter"(%2) {link = "ici", src = @v1, dst = @v2, src_sharding = [["x"]], dst_sharding = [["y"]], pieces = 2 : i64, piece_shape = array<i64: 2>} : (tensor<8xf32>) -> tensor<8xf32>
  %4 = "pw.compute"(%3) {callee = @f, slice = @v2, in_shardings = [[["y"]]], out_shardings = [[["y"]]], label = "f#2"} : (tensor<8xf32>) -> tensor<8xf32>
  %5 = "pw.gather"(%4) {link = "ici", src = @v2, dst = @v1, src_sharding = [["y"]], dst_sharding = [["x"]], pieces = 2 : i64, piece_shape = array<i64: 2>} : (tensor<8xf32>) -> tensor<8xf32>
  %6 = "pw.compute"(%5) {callee = @f, slice = @v1, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#3"} : (tensor<8xf32>) -> tensor<8xf32>
  return %6 : tensor<8xf32>
}
}
