// RUN: pw-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(pw-lower{topology=2x4})'
// RUN: pw-opt %s --split-input-file --verify-diagnostics --verify-each=false --pass-pipeline='builtin.module(pw-lower{topology=2x4})'
// RUN: not pw-opt %s --pass-pipeline='builtin.module(pw-lower{topology=2x4 strategy=random})' 2>&1 | FileCheck %s --check-prefix=OPTION

// pw-lower stops at the first phase that fails, with that pass's diagnostic;
// the input's errors are the same without the checks between passes.

// OPTION: invalid pass pipeline: option 'strategy' of 'pw-place' takes auto, spread or pack, not 'random'

// A slice that cannot be placed: more devices than any island has.
// expected-error@below {{cannot place slice @wide: it needs 8 devices in one island; free: island0 has 4 of 4 devices available (cpu, 1073741824 bytes each), island1 has 4 of 4 devices available}}
"pw.virtual_slice"() {sym_name = "wide", shape = array<i64: 8>, axes = ["x"], constraints = {}} : () -> ()

// -----

// Invalid pw IR stops before placement.
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 4>, axes = ["x"], constraints = {}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%a: tensor<6xf32>) -> tensor<6xf32> { return %a : tensor<6xf32> }
}
func.func @main(%a: tensor<6xf32>) -> tensor<6xf32> attributes {pw.program} {
  // expected-error@below {{dimension 0 of size 6 is split 4 ways}}
  %0 = "pw.compute"(%a) {callee = @f, slice = @v0, in_shardings = [[["x"]]], out_shardings = [[[]]], label = "f#0"} : (tensor<6xf32>) -> tensor<6xf32>
  return %0 : tensor<6xf32>
}

// -----

// A tensor of index passed pw-verify and stopped placement with an internal
// error; pw-verify refuses it before placement.
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
module @f attributes {pw.executable} {
  // expected-error@below {{argument 0 is tensor<4xindex>, whose element type index is not a pw element type}}
  func.func @main(%a: tensor<4xindex>) -> tensor<4xindex> { return %a : tensor<4xindex> }
}
// expected-error@below {{argument 0 is tensor<4xindex>, whose element type index is not a pw element type}}
func.func @main(%a: tensor<4xindex>) -> tensor<4xindex> attributes {pw.program} {
  %0 = "pw.compute"(%a) {callee = @f, slice = @v0, in_shardings = [[[]]], out_shardings = [[[]]], label = "f#0"} : (tensor<4xindex>) -> tensor<4xindex>
  return %0 : tensor<4xindex>
}
