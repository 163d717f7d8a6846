"""Expert-parallel ranks under mlx.launch: each rank owns a share of every layer's
experts; one all_sum per MoE layer combines them."""
