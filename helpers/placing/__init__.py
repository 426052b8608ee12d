"""Placing a model's arrays on devices, and training it there.

``devices`` (simulated CPU devices, meshes that fit them), ``sharding`` (which dimension of
which parameter goes to which mesh axis: the DP, FSDP and TP rules), ``models`` (the series'
MLP stack and Transformer), ``train`` (one sharded training step), ``zero`` (ZeRO stages
0-3: what each device keeps of the parameters, gradients and optimiser state).
"""
