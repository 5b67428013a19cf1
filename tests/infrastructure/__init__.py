"""What surrounds the library: loading, the bundled models, the CLI, the wheel, the docs site, the notebooks,
distributed runs, concurrency, the GPU check's dry run, the front faces, the architecture declarations, and
the test paths the docs cite."""
