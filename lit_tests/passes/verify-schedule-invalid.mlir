// RUN: pw-opt %s --split-input-file --verify-diagnostics --pw-verify-schedule

// Each case is an order that could deadlock or is incomplete.

// Every op needs an order.
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  // expected-error@below {{has no pw.order: run pw-schedule}}
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0"} : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

// Slices must be placed to know the islands.
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  // expected-error@below {{uses a slice without pw.placement: run pw-place}}
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0", pw.order = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

// An inconsistent pair: two programs' ops on island0 with the same order.
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @first(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0", pw.order = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
func.func @second(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  // expected-error@below {{has pw.order 0 like 'f#0', and both run on island0: the island may enqueue them either way}}
  %0 = "pw.compute"(%x) {callee = @f, slice = @b, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "g#0", pw.order = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

// A consumer enqueued before its producer on the same island deadlocks.
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0", pw.order = 1} : (tensor<8xf32>) -> tensor<8xf32>
  // expected-error@below {{is ordered 0 but uses a value of 'f#0', ordered 1: the schedule deadlocks in the cycle}}
  %1 = "pw.compute"(%0) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#1", pw.order = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %1 : tensor<8xf32>
}

// -----

// A deadlock across two programs and two islands: "b#0" waits for "a#0",
// which island0 runs after "d#0", which waits for "c#0", which island1 runs
// after "b#0".
"pw.virtual_slice"() {sym_name = "i0", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "i1", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 0, 2>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @p1(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @i0, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "a#0", pw.order = 2} : (tensor<8xf32>) -> tensor<8xf32>
  // expected-error@below {{'pw.compute' op is ordered 0 but uses a value of 'a#0', ordered 2: the schedule deadlocks in the cycle}}
  %1 = "pw.compute"(%0) {callee = @f, slice = @i1, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "b#0", pw.order = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %1 : tensor<8xf32>
}
func.func @p2(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @i1, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "c#0", pw.order = 1} : (tensor<8xf32>) -> tensor<8xf32>
  %1 = "pw.compute"(%0) {callee = @f, slice = @i0, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "d#0", pw.order = 1} : (tensor<8xf32>) -> tensor<8xf32>
  return %1 : tensor<8xf32>
}
