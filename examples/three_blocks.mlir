// The three-block program of the Pathways-on-Cloud blog, in pw IR: block A on
// one slice, block B on a second, block C on a third. Each block is one
// pw.compute however many devices its slice has.
"pw.virtual_slice"() {sym_name = "slice_a", shape = array<i64: 2>, axes = ["data"], constraints = {}} : () -> ()
"pw.virtual_slice"() {sym_name = "slice_b", shape = array<i64: 2, 2>, axes = ["data", "model"], constraints = {}} : () -> ()
"pw.virtual_slice"() {sym_name = "slice_c", shape = array<i64: 2>, axes = ["data"], constraints = {}} : () -> ()

module @block_a attributes {pw.executable} {
  func.func public @main(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
    %0 = "stablehlo.tanh"(%x) : (tensor<8x16xf32>) -> tensor<8x16xf32>
    return %0 : tensor<8x16xf32>
  }
}
module @block_b attributes {pw.executable} {
  func.func public @main(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
    %0 = "stablehlo.multiply"(%x, %x) : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
    return %0 : tensor<8x16xf32>
  }
}
module @block_c attributes {pw.executable} {
  func.func public @main(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
    %0 = "stablehlo.negate"(%x) : (tensor<8x16xf32>) -> tensor<8x16xf32>
    return %0 : tensor<8x16xf32>
  }
}

func.func @three_blocks(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {pw.program} {
  %a = "pw.compute"(%x) {callee = @block_a, slice = @slice_a, in_shardings = [[["data"], []]], out_shardings = [[["data"], []]], label = "block_a#0"} : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %b = "pw.compute"(%a) {callee = @block_b, slice = @slice_b, in_shardings = [[["data"], ["model"]]], out_shardings = [[["data"], ["model"]]], label = "block_b#0"} : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %c = "pw.compute"(%b) {callee = @block_c, slice = @slice_c, in_shardings = [[["data"], []]], out_shardings = [[["data"], []]], label = "block_c#0"} : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %c : tensor<8x16xf32>
}
