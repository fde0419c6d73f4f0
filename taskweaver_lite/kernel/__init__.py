"""The Jupyter kernel that runs generated code: the executor, its process, its output and its snapshot.

`interface.Executor` is the seam a session needs; `executor.KernelExecutor` implements it;
`process` starts and always ends the kernel process; `output` bounds what a cell returns;
`snapshot` is the standalone helper that describes user variables from inside the kernel.
"""
