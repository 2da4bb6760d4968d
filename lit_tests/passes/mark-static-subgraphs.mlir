// RUN: pw-opt %s --split-input-file --pw-mark-static-subgraphs | FileCheck %s

// pw-mark-static-subgraphs groups ops into one static subgraph, and starts a
// new, non-static subgraph after each data-dependent decision.

// A straight-line program is one static subgraph.
// CHECK-LABEL: func.func @chain
// CHECK-SAME: pw.subgraphs = [{id = 0 : i64, static = true}]
// CHECK: "pw.compute"{{.*}}pw.subgraph = 0 : i64
// CHECK: "pw.transfer"{{.*}}pw.subgraph = 0 : i64
// CHECK: "pw.compute"{{.*}}pw.subgraph = 0 : i64
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @chain(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0"} : (tensor<8xf32>) -> tensor<8xf32>
  %1 = "pw.transfer"(%0) {link = "ici", src = @a, dst = @b, sharding = [["x"]]} : (tensor<8xf32>) -> tensor<8xf32>
  %2 = "pw.compute"(%1) {callee = @f, slice = @b, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#1"} : (tensor<8xf32>) -> tensor<8xf32>
  return %2 : tensor<8xf32>
}

// -----

// A data-dependent branch splits the program: what uses the cond's result is
// subgraph 1 (non-static), a second cond on it starts subgraph 2; an op after
// the cond that does not use its result stays in the static subgraph 0. The
// branch programs are marked on their own.
// CHECK-LABEL: func.func @then
// CHECK-SAME: pw.subgraphs = [{id = 0 : i64, static = true}]
// CHECK-LABEL: func.func @branchy
// CHECK-SAME: pw.subgraphs = [{id = 0 : i64, static = true}, {id = 1 : i64, static = false}, {id = 2 : i64, static = false}]
// CHECK: "pw.compute"{{.*}}label = "pred#0"{{.*}}pw.subgraph = 0 : i64
// CHECK: "pw.cond"{{.*}}label = "k#0"{{.*}}pw.subgraph = 0 : i64
// CHECK: "pw.compute"{{.*}}label = "after#0"{{.*}}pw.subgraph = 1 : i64
// CHECK: "pw.compute"{{.*}}label = "other#0"{{.*}}pw.subgraph = 0 : i64
// CHECK: "pw.compute"{{.*}}label = "pred#1"{{.*}}pw.subgraph = 1 : i64
// CHECK: "pw.cond"{{.*}}label = "k#1"{{.*}}pw.subgraph = 1 : i64
// CHECK: "pw.compute"{{.*}}label = "last#0"{{.*}}pw.subgraph = 2 : i64
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
module @positive attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<i1> {
    %0 = "stablehlo.constant"() {value = dense<true> : tensor<i1>} : () -> tensor<i1>
    return %0 : tensor<i1>
  }
}
func.func @then(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "then#0"} : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
func.func @branchy(%x: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>) attributes {pw.program} {
  %p = "pw.compute"(%x) {callee = @positive, slice = @a, in_shardings = [[["x"]]], out_shardings = [[]], label = "pred#0"} : (tensor<8xf32>) -> tensor<i1>
  %y = "pw.cond"(%p, %x) {then_program = @then, else_program = @then, label = "k#0"} : (tensor<i1>, tensor<8xf32>) -> tensor<8xf32>
  %z = "pw.compute"(%y) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "after#0"} : (tensor<8xf32>) -> tensor<8xf32>
  %w = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "other#0"} : (tensor<8xf32>) -> tensor<8xf32>
  %q = "pw.compute"(%z) {callee = @positive, slice = @a, in_shardings = [[["x"]]], out_shardings = [[]], label = "pred#1"} : (tensor<8xf32>) -> tensor<i1>
  %v = "pw.cond"(%q, %w) {then_program = @then, else_program = @then, label = "k#1"} : (tensor<i1>, tensor<8xf32>) -> tensor<8xf32>
  %u = "pw.compute"(%v) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "last#0"} : (tensor<8xf32>) -> tensor<8xf32>
  return %u, %w : tensor<8xf32>, tensor<8xf32>
}
