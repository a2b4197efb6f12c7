# lit configuration for vflow: dialect round-trips, invalid IR, passes and
# the front end's output (AST, vt IR, diagnostics).
import os
import lit.formats

config.name = "vflow"
config.test_format = lit.formats.ShTest(execute_external=True)
config.suffixes = [".mlir", ".vflow", ".test"]
config.excludes = ["Inputs", "lit.cfg.py", "lit.site.cfg.py"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.vflow_obj_root, "tests", "lit")

path = os.pathsep.join([config.vflow_tools_dir, config.llvm_tools_dir,
                        config.environment.get("PATH", os.environ["PATH"])])
config.environment["PATH"] = path
config.substitutions.append(("%examples", os.path.join(config.vflow_src_root, "examples")))
