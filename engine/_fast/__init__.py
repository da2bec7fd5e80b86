"""The engine's performance machinery, apart from its formulas: the formula tracer and its
numba code generator (_formula_trace, _formula_kernels), the per-row programs generated from
the layout rules and the peak assembly (_rows), the compiled loop's skeleton and its loader
(_kernel_numba, _kernel), and the single-configuration path (_scalar). Nothing here is a
formula: engine/ holds those, one module per technique, and these follow them."""
