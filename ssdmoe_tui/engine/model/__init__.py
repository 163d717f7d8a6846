"""The model: mlx-lm classes with StreamedSwitch blocks in place of each MoE block
(loader), the blocks themselves (streamed), the routing-mass meter, context limits."""
