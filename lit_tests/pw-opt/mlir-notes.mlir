// RUN: not pw-opt %s --pw-verify 2>&1 | FileCheck %s
// RUN: not pw-opt %s --pw-verify 2>&1 | count 1

// An error of MLIR's verifier is one line: its note is said in it, and MLIR's
// "see current operation" note, which printed the whole op (hundreds of lines
// for a long program), is left out.

// CHECK: mlir-notes.mlir:[[@LINE+6]]:1: error: redefinition of symbol named 'main' (see existing symbol definition here at line [[@LINE+2]]){{$}}
// CHECK-NOT: see current operation
func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> attributes {pw.program} {
  return %a : tensor<4xf32>
}

func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> attributes {pw.program} {
  return %a : tensor<4xf32>
}
