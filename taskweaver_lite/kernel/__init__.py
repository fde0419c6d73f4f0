"""The Jupyter kernel that runs generated code: the executor, its process, its output and its snapshot.

`executor.KernelExecutor` implements the `Executor` protocol of `taskweaver_lite.execution`;
`process` starts and always ends the kernel process; `output` bounds what a cell returns;
`snapshot` is the standalone helper that describes user variables from inside the kernel.
"""
