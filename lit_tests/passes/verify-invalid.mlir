// RUN: pw-opt %s --split-input-file --verify-diagnostics --pw-verify

// Each case breaks one semantic rule that pw-verify checks.

// A slice needs one axis name per mesh dimension.
// expected-error@below {{slice @v0 has 2 mesh dimensions but 1 axis names}}
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2, 4>, axes = ["x"], constraints = {}} : () -> ()

// -----

// Axis names are unique.
// expected-error@below {{slice @v0 repeats an axis name}}
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2, 4>, axes = ["x", "x"], constraints = {}} : () -> ()

// -----

// Mesh dimensions are positive.
// expected-error@below {{slice @v0 has a non-positive mesh dimension in shape [0]}}
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 0>, axes = ["x"], constraints = {}} : () -> ()

// -----

// A slice has at least one dimension.
// expected-error@below {{slice @v0 has an empty shape}}
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64>, axes = [], constraints = {}} : () -> ()

// -----

// Constraints are known ones.
// expected-error@below {{slice @v0 has unknown constraint 'colour'}}
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {colour = "red"}} : () -> ()

// -----

// An elastic range bounds the shape, axis by axis, at its rank.
// expected-error@below {{slice @v0 shape [8] is not between min_shape [2] and max_shape [4]}}
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 8>, axes = ["x"], constraints = {min_shape = array<i64: 2>, max_shape = array<i64: 4>}} : () -> ()

// -----

// expected-error@below {{slice @v0 constraint 'min_shape' must be 2 positive integers, not [2]}}
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 4, 2>, axes = ["x", "y"], constraints = {min_shape = array<i64: 2>}} : () -> ()

// -----

// Constraint values have the right kind.
// expected-error@below {{slice @v0 constraint 'min_memory_bytes' must be a int}}
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {min_memory_bytes = "lots"}} : () -> ()

// -----

// A placement names as many devices as the slice has.
// expected-error@below {{slice @v0 has 4 devices but its placement names 2}}
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 4>, axes = ["x"], constraints = {}, pw.placement = {island = "i0", devices = array<i64: 0, 2>}} : () -> ()

// -----

// Placement ranges are well formed.
// expected-error@below {{placement devices must be half-open ranges}}
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 4>, axes = ["x"], constraints = {}, pw.placement = {island = "i0", devices = array<i64: 4, 0>}} : () -> ()

// -----

// Placement ranges are integers.
// expected-error@below {{placement devices must be half-open ranges}}
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 4>, axes = ["x"], constraints = {}, pw.placement = {island = "i0", devices = array<f32: 0.0, 2.0>}} : () -> ()

// -----

// Symbols are unique across kinds of op (MLIR's symbol table checks this on parse).
"pw.virtual_slice"() {sym_name = "f", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
// expected-error@below {{redefinition of symbol named 'f'}}
module @f attributes {pw.executable} {
  func.func @main() { return }
}

// -----

// A compiled function has an entry function.
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
// expected-error@below {{is a compiled function without an entry}}
module @f attributes {pw.executable} {
  func.func @a() { return }
  func.func @b() { return }
}

// -----

// Computations live inside programs.
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
// expected-error@below {{must be inside a program}}
"pw.compute"() {callee = @f, slice = @v0, in_shardings = [], out_shardings = [], label = "f#0"} : () -> ()

// -----

// A program declaration has no body to check or lower (pw-verify failed with an IndexError).
// expected-error@below {{'func.func' op is a program without a body, but a program is one block of pw ops ending in func.return}}
func.func private @decl(tensor<4xf32>) -> tensor<4xf32> attributes {pw.program}

// -----

// Nor are a program's other blocks read: a pw op there went unchecked, and lowering dropped it.
// expected-error@below {{'func.func' op is a program of 2 blocks, but a program is one block}}
func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> attributes {pw.program} {
  return %a : tensor<4xf32>
^bb1:
  %0 = "pw.compute"(%a) {callee = @nope, slice = @nope, in_shardings = [], out_shardings = [], label = "f#0"} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// Programs are at the top level of the module, and pw ops directly in their bodies: elsewhere they went
// unchecked, and lowering dropped them.
module @inner {
  // expected-error@below {{'func.func' op is nested in 'builtin.module', but slices and programs are at the top level of the module, and the other pw ops directly in a program's body}}
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> attributes {pw.program} {
    return %a : tensor<4xf32>
  }
  // expected-error@below {{'pw.virtual_slice' op is nested in 'builtin.module'}}
  "pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
}
func.func @helper(%a: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error@below {{'pw.compute' op is nested in 'func.func'}}
  %0 = "pw.compute"(%a) {callee = @nope, slice = @nope, in_shardings = [], out_shardings = [], label = "f#0"} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// Programs hold only pw ops.
func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> attributes {pw.program} {
  // expected-error@below {{'arith.addf' op is not allowed in a pw program}}
  %0 = arith.addf %a, %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// The callee must be a compiled function.
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> attributes {pw.program} {
  // expected-error@below {{'callee' refers to @missing, which is not a compiled function}}
  %0 = "pw.compute"(%a) {callee = @missing, slice = @v0, in_shardings = [[[]]], out_shardings = [[[]]], label = "f#0"} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// The slice must be a virtual slice.
module @f attributes {pw.executable} {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }
}
func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> attributes {pw.program} {
  // expected-error@below {{'slice' refers to @f, which is not a pw.virtual_slice}}
  %0 = "pw.compute"(%a) {callee = @f, slice = @f, in_shardings = [[[]]], out_shardings = [[[]]], label = "f#0"} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// One sharding per operand.
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }
}
func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> attributes {pw.program} {
  // expected-error@below {{has 1 operands but 2 entries in 'in_shardings'}}
  %0 = "pw.compute"(%a) {callee = @f, slice = @v0, in_shardings = [[[]], [[]]], out_shardings = [[[]]], label = "f#0"} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// A sharding has the tensor's rank.
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }
}
func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> attributes {pw.program} {
  // expected-error@below {{operand #0 on slice @v0: sharding [["x"], []] has rank 2 but the tensor has rank 1}}
  %0 = "pw.compute"(%a) {callee = @f, slice = @v0, in_shardings = [[["x"], []]], out_shardings = [[[]]], label = "f#0"} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// A sharding names axes of the slice.
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }
}
func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> attributes {pw.program} {
  // expected-error@below {{result #0 on slice @v0: sharding [["y"]] names axis 'y' which the slice does not have (axes: x)}}
  %0 = "pw.compute"(%a) {callee = @f, slice = @v0, in_shardings = [[[]]], out_shardings = [[["y"]]], label = "f#0"} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// A name of the input quoted in a message keeps it one line: a newline in it is escaped.
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }
}
func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> attributes {pw.program} {
  // expected-error@below {{sharding [["x\ny"]] names axis 'x\ny' which the slice does not have (axes: x)}}
  %0 = "pw.compute"(%a) {callee = @f, slice = @v0, in_shardings = [[[]]], out_shardings = [[["x\0Ay"]]], label = "f#0"} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// An axis splits at most one dimension.
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%a: tensor<4x4xf32>) -> tensor<4x4xf32> { return %a : tensor<4x4xf32> }
}
func.func @main(%a: tensor<4x4xf32>) -> tensor<4x4xf32> attributes {pw.program} {
  // expected-error@below {{uses axis 'x' more than once}}
  %0 = "pw.compute"(%a) {callee = @f, slice = @v0, in_shardings = [[["x"], ["x"]]], out_shardings = [[[], []]], label = "f#0"} : (tensor<4x4xf32>) -> tensor<4x4xf32>
  return %0 : tensor<4x4xf32>
}

// -----

// Sharded dimensions divide by their axis sizes.
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 4>, axes = ["x"], constraints = {}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%a: tensor<6xf32>) -> tensor<6xf32> { return %a : tensor<6xf32> }
}
func.func @main(%a: tensor<6xf32>) -> tensor<6xf32> attributes {pw.program} {
  // expected-error@below {{operand #0 on slice @v0: dimension 0 of size 6 is split 4 ways by [["x"]], which does not divide it}}
  %0 = "pw.compute"(%a) {callee = @f, slice = @v0, in_shardings = [[["x"]]], out_shardings = [[[]]], label = "f#0"} : (tensor<6xf32>) -> tensor<6xf32>
  return %0 : tensor<6xf32>
}

// -----

// Shardings are lists of lists of axis names.
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }
}
func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> attributes {pw.program} {
  // expected-error@below {{'in_shardings' must be a list of shardings}}
  %0 = "pw.compute"(%a) {callee = @f, slice = @v0, in_shardings = [[[1]]], out_shardings = [[[]]], label = "f#0"} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// Values are statically shaped tensors.
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%a: tensor<?xf32>) -> tensor<?xf32> { return %a : tensor<?xf32> }
}
func.func @main(%a: tensor<?xf32>) -> tensor<?xf32> attributes {pw.program} {
  // expected-error@below {{operand #0 has type tensor<?xf32>, but pw values are statically shaped tensors}}
  // expected-error@below {{result #0 has type tensor<?xf32>, but pw values are statically shaped tensors}}
  %0 = "pw.compute"(%a) {callee = @f, slice = @v0, in_shardings = [[[]]], out_shardings = [[[]]], label = "f#0"} : (tensor<?xf32>) -> tensor<?xf32>
  return %0 : tensor<?xf32>
}

// -----

// The computation's type is its callee's.
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }
}
func.func @main(%a: tensor<4xi32>) -> tensor<4xi32> attributes {pw.program} {
  // expected-error@below {{has type (tensor<4xi32>) -> tensor<4xi32> but its callee @f has type (tensor<4xf32>) -> tensor<4xf32>}}
  %0 = "pw.compute"(%a) {callee = @f, slice = @v0, in_shardings = [[[]]], out_shardings = [[[]]], label = "f#0"} : (tensor<4xi32>) -> tensor<4xi32>
  return %0 : tensor<4xi32>
}

// -----

// A cond's predicate is a scalar of a boolean, integer or float type.
func.func @a(%x: tensor<4xf32>) -> tensor<4xf32> attributes {pw.program} { return %x : tensor<4xf32> }
func.func @main(%p: tensor<complex<f32>>, %x: tensor<4xf32>) -> tensor<4xf32> attributes {pw.program} {
  // expected-error@below {{predicate must be a scalar of a boolean, integer or float type, not tensor<complex<f32>>}}
  %0 = "pw.cond"(%p, %x) {then_program = @a, else_program = @a, label = "c#0"} : (tensor<complex<f32>>, tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// A cond's branches are programs.
func.func @a(%x: tensor<4xf32>) -> tensor<4xf32> attributes {pw.program} { return %x : tensor<4xf32> }
func.func @main(%p: tensor<i1>, %x: tensor<4xf32>) -> tensor<4xf32> attributes {pw.program} {
  // expected-error@below {{'else_program' refers to @nope, which is not a program}}
  %0 = "pw.cond"(%p, %x) {then_program = @a, else_program = @nope, label = "c#0"} : (tensor<i1>, tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// A cond's branches take its inputs and give its results.
func.func @a(%x: tensor<4xf32>) -> tensor<4xf32> attributes {pw.program} { return %x : tensor<4xf32> }
func.func @b(%x: tensor<4xf32>) -> tensor<2xf32> attributes {pw.program} {
  %0 = "pw.cond"(%x, %x) {then_program = @a, else_program = @a, label = "c#1"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  // expected-error@-1 {{predicate must be a scalar of a boolean, integer or float type}}
  %c = "pw.cond"(%x, %x) {then_program = @a, else_program = @a, label = "c#2"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<2xf32>
  // expected-error@-1 {{predicate must be a scalar of a boolean, integer or float type}}
  // expected-error@-2 {{passes (tensor<4xf32>) -> tensor<2xf32> but 'then_program' @a has type (tensor<4xf32>) -> tensor<4xf32>}}
  // expected-error@-3 {{passes (tensor<4xf32>) -> tensor<2xf32> but 'else_program' @a has type}}
  return %c : tensor<2xf32>
}

// -----

// A data movement names a known link.
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> attributes {pw.program} {
  // expected-error@below {{link must be one of ici, dcn, not 'pcie'}}
  %0 = "pw.transfer"(%a) {link = "pcie", src = @v0, dst = @v0, sharding = [[]]} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// A data movement keeps the type.
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
func.func @main(%a: tensor<4xf32>) -> tensor<4xf16> attributes {pw.program} {
  // expected-error@below {{changes the type from tensor<4xf32> to tensor<4xf16>}}
  %0 = "pw.transfer"(%a) {link = "ici", src = @v0, dst = @v0, sharding = [[]]} : (tensor<4xf32>) -> tensor<4xf16>
  return %0 : tensor<4xf16>
}

// -----

// A transfer's sharding is valid on both slices.
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
"pw.virtual_slice"() {sym_name = "v1", shape = array<i64: 2>, axes = ["y"], constraints = {}} : () -> ()
func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> attributes {pw.program} {
  // expected-error@below {{'sharding' on slice @v1: sharding [["x"]] names axis 'x' which the slice does not have}}
  %0 = "pw.transfer"(%a) {link = "dcn", src = @v0, dst = @v1, sharding = [["x"]]} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// A transfer moves shards of equal shape; resharding needs scatter or gather.
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
"pw.virtual_slice"() {sym_name = "v1", shape = array<i64: 4>, axes = ["x"], constraints = {}} : () -> ()
func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> attributes {pw.program} {
  // expected-error@below {{a pw.scatter or pw.gather is needed}}
  %0 = "pw.transfer"(%a) {link = "ici", src = @v0, dst = @v1, sharding = [["x"]]} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// A scatter goes to more shards.
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 4>, axes = ["x"], constraints = {}} : () -> ()
"pw.virtual_slice"() {sym_name = "v1", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
func.func @main(%a: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  // expected-error@below {{scatters 4-way into 2-way}}
  %0 = "pw.scatter"(%a) {link = "ici", src = @v0, dst = @v1, src_sharding = [["x"]], dst_sharding = [["x"]], pieces = 2 : i64, piece_shape = array<i64: 4>} : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

// A gather goes to fewer shards.
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
"pw.virtual_slice"() {sym_name = "v1", shape = array<i64: 4>, axes = ["x"], constraints = {}} : () -> ()
func.func @main(%a: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  // expected-error@below {{gathers 2-way into 4-way}}
  %0 = "pw.gather"(%a) {link = "ici", src = @v0, dst = @v1, src_sharding = [["x"]], dst_sharding = [["x"]], pieces = 2 : i64, piece_shape = array<i64: 4>} : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

// Pieces have the shape of the smaller shards, and there are enough of them.
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
"pw.virtual_slice"() {sym_name = "v1", shape = array<i64: 4>, axes = ["x"], constraints = {}} : () -> ()
func.func @main(%a: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  // expected-error@below {{has piece_shape [4] but the pieces are [2]}}
  // expected-error@below {{has 3 pieces per shard but 2-way to 4-way needs 2}}
  %0 = "pw.scatter"(%a) {link = "ici", src = @v0, dst = @v1, src_sharding = [["x"]], dst_sharding = [["x"]], pieces = 3 : i64, piece_shape = array<i64: 4>} : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

// A moved value arrives where it is used.
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
"pw.virtual_slice"() {sym_name = "v1", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }
}
func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> attributes {pw.program} {
  %0 = "pw.transfer"(%a) {link = "ici", src = @v0, dst = @v1, sharding = [["x"]]} : (tensor<4xf32>) -> tensor<4xf32>
  // expected-error@below {{operand #0 lives on @v1 with sharding [["x"]], but the op uses it on @v0 with sharding [["x"]]}}
  %1 = "pw.compute"(%0) {callee = @f, slice = @v0, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0"} : (tensor<4xf32>) -> tensor<4xf32>
  return %1 : tensor<4xf32>
}

// -----

// A program ends with func.return (MLIR takes an unregistered last op for a terminator).
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }
}
// expected-error@below {{'func.func' op is a program whose body does not end with func.return}}
func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> attributes {pw.program} {
  %0 = "pw.compute"(%a) {callee = @f, slice = @v0, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0"} : (tensor<4xf32>) -> tensor<4xf32>
}

// -----

// A computation on a malformed slice is not checked against it (nor does it crash the checker).
// expected-error@below {{slice @v0 axis names must be non-empty strings}}
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = [["x"]], constraints = {}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }
}
func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> attributes {pw.program} {
  %0 = "pw.compute"(%a) {callee = @f, slice = @v0, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0"} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// The marks later passes read have their kinds: an attribute pw does not know
// (here an opaque #rray<...>) is reported, not trusted.
// expected-error@below {{slice @v0 placement must be {island = "name", devices = array<i64: ...>}}}
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "i0", devices = #rray<i64: 0, 2>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }
}
// expected-error@below {{argument #0 has a 'pw.home' that is not {} or {slice, sharding} on a slice of this module}}
func.func @main(%a: tensor<4xf32> {pw.home = {slice = @nowhere, sharding = [["x"]]}}) -> tensor<4xf32> attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  // expected-error@below {{'pw.order' must be a non-negative integer}}
  %0 = "pw.compute"(%a) {callee = @f, slice = @v0, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0", pw.order = "first"} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// A program's subgraphs and a cond's result homes have their shapes too.
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
// expected-error@below {{'pw.subgraphs' must be a list of {id = <integer>, static = <bool>}}}
func.func @main(%p: tensor<i1>, %a: tensor<4xf32>) -> tensor<4xf32> attributes {pw.program, pw.subgraphs = [{id = 0}]} {
  // expected-error@below {{'pw.result_homes' must hold one {} or {slice, sharding} per result}}
  %0 = "pw.cond"(%p, %a) {then_program = @id, else_program = @id, label = "k#0", pw.result_homes = []} : (tensor<i1>, tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
func.func @id(%a: tensor<4xf32>) -> tensor<4xf32> attributes {pw.program} {
  return %a : tensor<4xf32>
}

// -----

// A donated program argument is marked with a unit attribute, nothing else.
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }
}
// expected-error@below {{argument #0 has a 'pw.donated' that is not a unit attribute}}
func.func @main(%a: tensor<4xf32> {pw.donated = 1 : i64}) -> tensor<4xf32> attributes {pw.program} {
  %0 = "pw.compute"(%a) {callee = @f, slice = @v0, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0"} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// A placement is on an island of the module's pw.topology, within its devices
// (the pipeline failed late, at 1:1, about plan steps).
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
// expected-error@below {{slice @a is placed on island 'island9', but the module's pw.topology has no such island (islands: island0)}}
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island9", devices = array<i64: 0, 2>}} : () -> ()
// expected-error@below {{slice @b is placed on devices [3, 5] (ranges [begin, end)) of island0, but island0 has 4 devices}}
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 3, 5>}} : () -> ()
}

// -----

// A value of no elements is replicated, as the frontend lays it out: a sharded
// one passed here, and pw-lower then refused the plans it wrote for it.
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%a: tensor<0x16xf32>) -> tensor<0x16xf32> { return %a : tensor<0x16xf32> }
}
func.func @main(%a: tensor<0x16xf32>) -> tensor<0x16xf32> attributes {pw.program} {
  // expected-error@below {{operand #0 on slice @v0: shape [0, 16] has no elements but is split by [["x"], []]: a zero-size value is replicated}}
  // expected-error@below {{result #0 on slice @v0: shape [0, 16] has no elements but is split by [["x"], []]: a zero-size value is replicated}}
  %0 = "pw.compute"(%a) {callee = @f, slice = @v0, in_shardings = [[["x"], []]], out_shardings = [[["x"], []]], label = "f#0"} : (tensor<0x16xf32>) -> tensor<0x16xf32>
  return %0 : tensor<0x16xf32>
}

// -----

// Values are tensors of the element types plans hold (dialect/element_types.py):
// placement and memory planning size every value by that table (a tensor of
// index stopped pw-place with an internal error). A compiled function nobody
// calls is checked too.
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
module @f attributes {pw.executable} {
  // expected-error@below {{'func.func' op result 0 is tensor<4xindex>, whose element type index is not a pw element type (known: i1, i4, i8,}}
  func.func @main(%a: tensor<4xf32>) -> tensor<4xindex> {
    %0 = "x.cast"(%a) : (tensor<4xf32>) -> tensor<4xindex>
    return %0 : tensor<4xindex>
  }
}
module @unused attributes {pw.executable} {
  // expected-error@below {{'func.func' op argument 0 is tensor<2x!pw.unknown>, whose element type !pw.unknown is not a pw element type}}
  func.func @main(%a: tensor<2x!pw.unknown>) { return }
}
// expected-error@below {{'func.func' op argument 1 is tensor<4xindex>, whose element type index is not a pw element type}}
func.func @main(%a: tensor<4xf32>, %i: tensor<4xindex>) -> tensor<4xindex> attributes {pw.program} {
  %0 = "pw.compute"(%a) {callee = @f, slice = @v0, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0"} : (tensor<4xf32>) -> tensor<4xindex>
  return %0 : tensor<4xindex>
}

// -----

// An element type with a bit width is not enough: values are of the types the
// plans hold (i128, si32, i2, i0, tf32 passed pw-verify, and only the last
// pass of pw-lower refused them, at a pw.buffer the user never wrote).
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
module @f attributes {pw.executable} {
  // expected-error@below {{'func.func' op result 0 is tensor<4xi128>, whose element type i128 is not a pw element type (known: i1, i4, i8,}}
  func.func @main(%a: tensor<4xf32>) -> tensor<4xi128> {
    %0 = "x.cast"(%a) : (tensor<4xf32>) -> tensor<4xi128>
    return %0 : tensor<4xi128>
  }
}
module @g attributes {pw.executable} {
  // expected-error@below {{'func.func' op argument 0 is tensor<4xsi32>, whose element type si32 is not a pw element type}}
  func.func @main(%a: tensor<4xsi32>) { return }
}
module @h attributes {pw.executable} {
  // expected-error@below {{'func.func' op argument 1 is tensor<4xi2>, whose element type i2 is not a pw element type}}
  func.func @main(%a: tensor<4xi1>, %b: tensor<4xi2>, %c: tensor<4xi0>) { return }
}
// expected-error@below {{'func.func' op argument 0 is tensor<4xtf32>, whose element type tf32 is not a pw element type}}
func.func @main(%a: tensor<4xtf32>, %b: tensor<4xf32>) -> tensor<4xi128> attributes {pw.program} {
  %0 = "pw.compute"(%b) {callee = @f, slice = @v0, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0"} : (tensor<4xf32>) -> tensor<4xi128>
  return %0 : tensor<4xi128>
}
