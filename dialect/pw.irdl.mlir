// The `pw` dialect, defined declaratively with IRDL and loaded at run time
// into the upstream MLIR Python bindings (see dialect/context.py).
//
// IRDL gives structure only: operand/result counts and attribute kinds. The
// semantic rules (symbols resolve, shardings fit shapes and slices, values live
// where they are used) are checked by the `pw-verify` pass.
//
// Every attribute is a builtin attribute so that passes written in Python can
// read it. IRDL has no traits, so the dialect has no region-holding ops:
// compiled functions are nested `builtin.module`s marked `pw.executable`, the
// branches of `pw.cond` are programs referenced by symbol, and each island plan
// is a nested `builtin.module` marked `pw.island_plan`.
irdl.dialect @pw {
  // ===------------------------------------------------------------------=== //
  // Device-agnostic level
  // ===------------------------------------------------------------------=== //

  // A virtual device mesh requested from the resource manager.
  //   shape       : array<i64: 2, 4>        mesh shape
  //   axes        : ["data", "model"]       one name per mesh dimension
  //   constraints : {device_kind = "cpu", island = "island0",
  //                  min_memory_bytes = 1024 : i64}
  irdl.operation @virtual_slice {
    %name = irdl.base "#builtin.string"
    %shape = irdl.base "#builtin.dense_array"
    %axes = irdl.base "#builtin.array"
    %constraints = irdl.base "#builtin.dictionary"
    irdl.attributes {
      "sym_name" = %name,
      "shape" = %shape,
      "axes" = %axes,
      "constraints" = %constraints
    }
  }

  // One sharded computation: calls the compiled function `callee` (a nested
  // module marked `pw.executable`) on every device of `slice`. One op however
  // many devices the slice has.
  //   in_shardings / out_shardings : one entry per operand / result, each a
  //     list with one entry per tensor dimension, each the list of slice axes
  //     that dimension is split over: [[["data"], []]] for a 2-D tensor split
  //     on its rows over "data".
  //   label : a stable name for plans and traces, e.g. "block_a#0".
  irdl.operation @compute {
    %in = irdl.any
    %out = irdl.any
    irdl.operands(inputs: variadic %in)
    irdl.results(outputs: variadic %out)
    %callee = irdl.base "#builtin.symbol_ref"
    %slice = irdl.base "#builtin.symbol_ref"
    %in_shardings = irdl.base "#builtin.array"
    %out_shardings = irdl.base "#builtin.array"
    %label = irdl.base "#builtin.string"
    irdl.attributes {
      "callee" = %callee,
      "slice" = %slice,
      "in_shardings" = %in_shardings,
      "out_shardings" = %out_shardings,
      "label" = %label
    }
  }

  // A data-dependent step: the host reads the scalar `pred` (a tensor<i1>, or
  // of an integer or float type: true when nonzero, as `jax.lax.cond` reads
  // it) and runs the program `then_program` or `else_program` on `inputs`. What
  // follows it cannot be dispatched before the predicate is known.
  irdl.operation @cond {
    %pred = irdl.any
    %in = irdl.any
    %out = irdl.any
    irdl.operands(pred: %pred, inputs: variadic %in)
    irdl.results(outputs: variadic %out)
    %then = irdl.base "#builtin.symbol_ref"
    %else = irdl.base "#builtin.symbol_ref"
    %label = irdl.base "#builtin.string"
    irdl.attributes {
      "then_program" = %then,
      "else_program" = %else,
      "label" = %label
    }
  }

  // ===------------------------------------------------------------------=== //
  // Lowered level: data movement
  // ===------------------------------------------------------------------=== //

  // Moves a value, unchanged in sharding, from the devices of slice `src` to
  // those of slice `dst` over `link` ("ici" inside an island, "dcn" between).
  irdl.operation @transfer {
    %in = irdl.any
    %out = irdl.any
    irdl.operands(input: %in)
    irdl.results(output: %out)
    %link = irdl.base "#builtin.string"
    %src = irdl.base "#builtin.symbol_ref"
    %dst = irdl.base "#builtin.symbol_ref"
    %sharding = irdl.base "#builtin.array"
    irdl.attributes {
      "link" = %link,
      "src" = %src,
      "dst" = %dst,
      "sharding" = %sharding
    }
  }

  // Reshards an M-way sharded value into an N-way one with N > M: every
  // source shard is cut into `pieces` pieces of `piece_shape`, each sent to
  // its destination device.
  irdl.operation @scatter {
    %in = irdl.any
    %out = irdl.any
    irdl.operands(input: %in)
    irdl.results(output: %out)
    %link = irdl.base "#builtin.string"
    %src = irdl.base "#builtin.symbol_ref"
    %dst = irdl.base "#builtin.symbol_ref"
    %src_sharding = irdl.base "#builtin.array"
    %dst_sharding = irdl.base "#builtin.array"
    %pieces = irdl.base "#builtin.integer"
    %piece_shape = irdl.base "#builtin.dense_array"
    irdl.attributes {
      "link" = %link,
      "src" = %src,
      "dst" = %dst,
      "src_sharding" = %src_sharding,
      "dst_sharding" = %dst_sharding,
      "pieces" = %pieces,
      "piece_shape" = %piece_shape
    }
  }

  // Reshards an M-way sharded value into an N-way one with N < M: every
  // destination shard is assembled from `pieces` pieces of `piece_shape`.
  irdl.operation @gather {
    %in = irdl.any
    %out = irdl.any
    irdl.operands(input: %in)
    irdl.results(output: %out)
    %link = irdl.base "#builtin.string"
    %src = irdl.base "#builtin.symbol_ref"
    %dst = irdl.base "#builtin.symbol_ref"
    %src_sharding = irdl.base "#builtin.array"
    %dst_sharding = irdl.base "#builtin.array"
    %pieces = irdl.base "#builtin.integer"
    %piece_shape = irdl.base "#builtin.dense_array"
    irdl.attributes {
      "link" = %link,
      "src" = %src,
      "dst" = %dst,
      "src_sharding" = %src_sharding,
      "dst_sharding" = %dst_sharding,
      "pieces" = %pieces,
      "piece_shape" = %piece_shape
    }
  }

  // ===------------------------------------------------------------------=== //
  // Lowered level: per-island plan steps
  // ===------------------------------------------------------------------=== //
  // Plan steps live in a nested module marked `pw.island_plan` (one per
  // island a program uses) or `pw.host_plan` (the program's host side: its
  // inputs, outputs and data-dependent steps), and name buffers by integer
  // id, so a plan serialises without SSA. Common fields:
  //   step  : the step's id, unique in the program; an island runs its steps
  //           in the order listed, its consistent order
  //   after : steps (of any island, or the host) that must complete first
  //   devices : island-local device ids as half-open ranges
  //             [begin0, end0, begin1, end1, ...] in mesh order
  //   bytes, output_bytes : per device, what each device allocates

  // A buffer of the program: one logical, possibly sharded value of `type`,
  // living on `home` = {slice = @v0, sharding = [[...]]} ({} for a host value,
  // one the runtime has not put on devices), `bytes_per_device` on each of
  // the slice's devices. Declared in the plan of the island that holds it.
  irdl.operation @buffer {
    %id = irdl.base "#builtin.integer"
    %type = irdl.base "#builtin.type"
    %home = irdl.base "#builtin.dictionary"
    %bytes = irdl.base "#builtin.integer"
    irdl.attributes {
      "id" = %id,
      "type" = %type,
      "home" = %home,
      "bytes_per_device" = %bytes
    }
  }

  // Runs `executable` on the `devices` of `slice`, reading buffers `inputs`,
  // writing buffers `outputs` whose sizes in bytes are `output_bytes`.
  irdl.operation @launch {
    %step = irdl.base "#builtin.integer"
    %after = irdl.base "#builtin.dense_array"
    %executable = irdl.base "#builtin.symbol_ref"
    %slice = irdl.base "#builtin.symbol_ref"
    %devices = irdl.base "#builtin.dense_array"
    %inputs = irdl.base "#builtin.dense_array"
    %outputs = irdl.base "#builtin.dense_array"
    %output_bytes = irdl.base "#builtin.dense_array"
    %subgraph = irdl.base "#builtin.integer"
    %label = irdl.base "#builtin.string"
    irdl.attributes {
      "step" = %step,
      "after" = %after,
      "executable" = %executable,
      "slice" = %slice,
      "devices" = %devices,
      "inputs" = %inputs,
      "outputs" = %outputs,
      "output_bytes" = %output_bytes,
      "subgraph" = %subgraph,
      "label" = %label
    }
  }

  // Sends buffer `buffer` (`bytes` bytes, on `devices`) over `link` to the
  // island `peer`, to be received there as `peer_buffer`.
  irdl.operation @send {
    %step = irdl.base "#builtin.integer"
    %after = irdl.base "#builtin.dense_array"
    %buffer = irdl.base "#builtin.integer"
    %peer_buffer = irdl.base "#builtin.integer"
    %bytes = irdl.base "#builtin.integer"
    %link = irdl.base "#builtin.string"
    %peer = irdl.base "#builtin.string"
    %devices = irdl.base "#builtin.dense_array"
    %subgraph = irdl.base "#builtin.integer"
    irdl.attributes {
      "step" = %step,
      "after" = %after,
      "buffer" = %buffer,
      "peer_buffer" = %peer_buffer,
      "bytes" = %bytes,
      "link" = %link,
      "peer" = %peer,
      "devices" = %devices,
      "subgraph" = %subgraph
    }
  }

  // Receives into `buffer` (`bytes` bytes, on `devices`) what island `peer`
  // sends from its `peer_buffer` over `link`.
  irdl.operation @recv {
    %step = irdl.base "#builtin.integer"
    %after = irdl.base "#builtin.dense_array"
    %buffer = irdl.base "#builtin.integer"
    %peer_buffer = irdl.base "#builtin.integer"
    %bytes = irdl.base "#builtin.integer"
    %link = irdl.base "#builtin.string"
    %peer = irdl.base "#builtin.string"
    %devices = irdl.base "#builtin.dense_array"
    %subgraph = irdl.base "#builtin.integer"
    irdl.attributes {
      "step" = %step,
      "after" = %after,
      "buffer" = %buffer,
      "peer_buffer" = %peer_buffer,
      "bytes" = %bytes,
      "link" = %link,
      "peer" = %peer,
      "devices" = %devices,
      "subgraph" = %subgraph
    }
  }

  // Moves (and reshards) buffer `src_buffer` into `dst_buffer` between two
  // slices of this island, or inside one slice, over `link` ("ici").
  irdl.operation @copy {
    %step = irdl.base "#builtin.integer"
    %after = irdl.base "#builtin.dense_array"
    %src = irdl.base "#builtin.integer"
    %dst = irdl.base "#builtin.integer"
    %bytes = irdl.base "#builtin.integer"
    %link = irdl.base "#builtin.string"
    %subgraph = irdl.base "#builtin.integer"
    irdl.attributes {
      "step" = %step,
      "after" = %after,
      "src_buffer" = %src,
      "dst_buffer" = %dst,
      "bytes" = %bytes,
      "link" = %link,
      "subgraph" = %subgraph
    }
  }

  // Drops `buffers` from the island's devices once the steps in `after`
  // (their last readers) have run (`pw-plan-memory`).
  irdl.operation @free {
    %step = irdl.base "#builtin.integer"
    %after = irdl.base "#builtin.dense_array"
    %buffers = irdl.base "#builtin.dense_array"
    %subgraph = irdl.base "#builtin.integer"
    irdl.attributes {
      "step" = %step,
      "after" = %after,
      "buffers" = %buffers,
      "subgraph" = %subgraph
    }
  }

  // A host step (in the `pw.host_plan` module): reads the tensor<i1> buffer
  // `pred` and runs the plans of `then_program` or `else_program` on buffers
  // `inputs`, whose results become buffers `outputs`.
  irdl.operation @branch {
    %step = irdl.base "#builtin.integer"
    %after = irdl.base "#builtin.dense_array"
    %pred = irdl.base "#builtin.integer"
    %inputs = irdl.base "#builtin.dense_array"
    %outputs = irdl.base "#builtin.dense_array"
    %then = irdl.base "#builtin.symbol_ref"
    %else = irdl.base "#builtin.symbol_ref"
    %subgraph = irdl.base "#builtin.integer"
    %label = irdl.base "#builtin.string"
    irdl.attributes {
      "step" = %step,
      "after" = %after,
      "pred" = %pred,
      "inputs" = %inputs,
      "outputs" = %outputs,
      "then_program" = %then,
      "else_program" = %else,
      "subgraph" = %subgraph,
      "label" = %label
    }
  }
}
