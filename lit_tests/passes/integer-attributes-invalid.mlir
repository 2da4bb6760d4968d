// RUN: pw-opt %s --split-input-file --verify-diagnostics --pw-verify

// Integer attributes pw reads are in the i64 range: the bindings abort reading
// a wider value, and read a ui64 from 2^63 on as negative (a slice asking for
// 2^64 - 1 bytes a device was placed on 1 GiB devices). A size is not negative.

// expected-error@below {{'pw.virtual_slice' op attribute 'constraints' cannot be read by the MLIR Python bindings: it is an integer of 128 bits, and pw reads integers of at most 64 bits}}
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {min_memory_bytes = 99999999999999999999999 : i128}} : () -> ()

// -----

"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%a: tensor<8x16xf32>) -> tensor<8x16xf32> { return %a : tensor<8x16xf32> }
}
func.func @main(%a: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {pw.program} {
  // expected-error@below {{'pw.compute' op attribute 'pw.order' cannot be read by the MLIR Python bindings: it is an integer of 128 bits}}
  %0 = "pw.compute"(%a) {callee = @f, slice = @v0, in_shardings = [[["x"], []]], out_shardings = [[["x"], []]], label = "f#0", pw.order = 99999999999999999999999 : i128} : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

// expected-error@below {{'func.func' op attribute 'pw.subgraphs' cannot be read by the MLIR Python bindings: it is an integer of 128 bits}}
func.func @main(%a: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program, pw.subgraphs = [{id = 99999999999999999999999 : i128, static = true}]} {
  return %a : tensor<8xf32>
}

// -----

// expected-error@below {{'func.func' op attribute 'arg_attrs' cannot be read by the MLIR Python bindings: it is an integer of 65 bits}}
func.func @main(%a: tensor<8xf32> {pw.other = 36893488147419103231 : i65}) -> tensor<8xf32> attributes {pw.program} {
  return %a : tensor<8xf32>
}

// -----

// expected-error@below {{'pw.virtual_slice' op attribute 'constraints' cannot be read by the MLIR Python bindings: they read 18446744073709551615 : ui64 as -1, and pw reads integers of the i64 range}}
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {min_memory_bytes = 18446744073709551615 : ui64}} : () -> ()

// -----

// One below 2^63 is read as it is.
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {min_memory_bytes = 9223372036854775807 : ui64}} : () -> ()

// -----

// expected-error@below {{slice @v0 constraint 'min_memory_bytes' must not be negative, not -5}}
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {min_memory_bytes = -5}} : () -> ()
