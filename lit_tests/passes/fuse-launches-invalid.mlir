// RUN: pw-opt %s --split-input-file --verify-diagnostics --pw-fuse-launches

// Each case is a module pw-fuse-launches cannot work on.

// Fusion stays inside static subgraphs, so they must be marked first.
module {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
// expected-error@below {{pw-fuse-launches needs static subgraphs: run pw-mark-static-subgraphs}}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0"} : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
}
