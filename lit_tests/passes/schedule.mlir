// RUN: pw-opt %s --split-input-file --pw-schedule | FileCheck %s

// pw-schedule orders every op of every program in one module-wide FIFO order
// (static subgraph first) and records estimated costs.

// Inside a program, the static subgraph 0 comes first: "other#0", written
// after the cond, is enqueued before what waits for the cond's result.
// CHECK-LABEL: func.func @branchy
// CHECK: label = "pred#0"{{.*}}pw.order = 0 : i64
// CHECK: label = "k#0"{{.*}}pw.order = 1 : i64
// CHECK: label = "after#0"{{.*}}pw.order = 3 : i64
// CHECK: label = "other#0"{{.*}}pw.order = 2 : i64
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
func.func @branchy(%x: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>) attributes {pw.program} {
  %p = "pw.compute"(%x) {callee = @positive, slice = @a, in_shardings = [[["x"]]], out_shardings = [[]], label = "pred#0", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<i1>
  %y = "pw.cond"(%p, %x) {then_program = @branch, else_program = @branch, label = "k#0", pw.subgraph = 0} : (tensor<i1>, tensor<8xf32>) -> tensor<8xf32>
  %z = "pw.compute"(%y) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "after#0", pw.subgraph = 1} : (tensor<8xf32>) -> tensor<8xf32>
  %w = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "other#0", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %z, %w : tensor<8xf32>, tensor<8xf32>
}
func.func @branch(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  return %x : tensor<8xf32>
}

// -----

// Two programs sharing slice @a (so its island): one order over both, FIFO
// in module order, so the island enqueues their ops alike everywhere.
// CHECK-LABEL: func.func @first
// CHECK: label = "f#0"{{.*}}pw.order = 0 : i64
// CHECK: "pw.transfer"{{.*}}pw.order = 1 : i64
// CHECK: label = "f#1"{{.*}}pw.order = 2 : i64
// CHECK-LABEL: func.func @second
// CHECK: label = "g#0"{{.*}}pw.order = 3 : i64
// CHECK: label = "g#1"{{.*}}pw.order = 4 : i64
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @first(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0"} : (tensor<8xf32>) -> tensor<8xf32>
  %1 = "pw.transfer"(%0) {link = "ici", src = @a, dst = @b, sharding = [["x"]]} : (tensor<8xf32>) -> tensor<8xf32>
  %2 = "pw.compute"(%1) {callee = @f, slice = @b, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#1"} : (tensor<8xf32>) -> tensor<8xf32>
  return %2 : tensor<8xf32>
}
func.func @second(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "g#0"} : (tensor<8xf32>) -> tensor<8xf32>
  %1 = "pw.compute"(%0) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "g#1"} : (tensor<8xf32>) -> tensor<8xf32>
  return %1 : tensor<8xf32>
}

// -----

// The cost model: dot_general 2*8*8*8 + tanh 8*8 FLOPs; per device the work
// splits over the 2 row shards of the result; bytes are the arguments and
// results (per device: its shards). Convolution: 2 * 288 outputs * 36 MACs.
// Reduce: one per input element (its combiner is not counted again).
// CHECK-LABEL: module @conv attributes {pw.cost = {bytes = 2880 : i64, flops = 20736 : i64}
// CHECK-LABEL: module @mm attributes {pw.cost = {bytes = 768 : i64, flops = 1088 : i64}
// CHECK-LABEL: module @sum attributes {pw.cost = {bytes = 260 : i64, flops = 64 : i64}
// CHECK-LABEL: func.func @costs
// CHECK: label = "mm#0", {{.*}}pw.cost = {bytes = 512 : i64, flops = 544 : i64}
// CHECK: label = "sum#0", {{.*}}pw.cost = {bytes = 260 : i64, flops = 64 : i64}
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
module @conv attributes {pw.executable} {
  func.func @main(%x: tensor<1x6x6x4xf32>, %k: tensor<3x3x4x8xf32>) -> tensor<1x6x6x8xf32> {
    %0 = "stablehlo.convolution"(%x, %k) <{batch_group_count = 1 : i64, dimension_numbers = #stablehlo.conv<[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]>, feature_group_count = 1 : i64}> : (tensor<1x6x6x4xf32>, tensor<3x3x4x8xf32>) -> tensor<1x6x6x8xf32>
    return %0 : tensor<1x6x6x8xf32>
  }
}
module @mm attributes {pw.executable} {
  func.func @main(%x: tensor<8x8xf32>, %w: tensor<8x8xf32>) -> tensor<8x8xf32> {
    %0 = "stablehlo.dot_general"(%x, %w) <{dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>}> : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
    %1 = "stablehlo.tanh"(%0) : (tensor<8x8xf32>) -> tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }
}
module @sum attributes {pw.executable} {
  func.func @main(%x: tensor<8x8xf32>) -> tensor<f32> {
    %c = "stablehlo.constant"() {value = dense<0.0> : tensor<f32>} : () -> tensor<f32>
    %0 = "stablehlo.reduce"(%x, %c) ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = "stablehlo.add"(%a, %b) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%s) : (tensor<f32>) -> ()
    }) {dimensions = array<i64: 0, 1>} : (tensor<8x8xf32>, tensor<f32>) -> tensor<f32>
    return %0 : tensor<f32>
  }
}
// (pw.compute's operands share one type: IRDL binds a variadic group's
// constraint once.)
func.func @costs(%x: tensor<8x8xf32>, %w: tensor<8x8xf32>) -> tensor<f32> attributes {pw.program} {
  %0 = "pw.compute"(%x, %w) {callee = @mm, slice = @a, in_shardings = [[["x"], []], [[], []]], out_shardings = [[["x"], []]], label = "mm#0"} : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
  %1 = "pw.compute"(%0) {callee = @sum, slice = @a, in_shardings = [[[], []]], out_shardings = [[]], label = "sum#0"} : (tensor<8x8xf32>) -> tensor<f32>
  return %1 : tensor<f32>
}
