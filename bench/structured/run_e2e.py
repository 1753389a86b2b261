"""run_e2e.py — the structured-output acceptance run: 200 extraction lines over the 20
schemas of tests/integration/structured_cases.py (10 documents each, max_tokens 128,
temperature 0) through `medley run` on SmolLM2 and Gemma 3 (CPU unless --device). Every
answer that ends with finish_reason "stop" must validate with jsonschema + FormatChecker (the
run fails otherwise); the share that finished within max_tokens is printed per model.

    MEDLEY_BIN=build/cli/medley python3 bench/structured/run_e2e.py [--models smollm2-135m,gemma3-270m]
"""
import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TEST = os.path.join(HERE, "..", "..", "tests", "integration", "structured_run.py")

ap = argparse.ArgumentParser()
ap.add_argument("--models", default="smollm2-135m,gemma3-270m")
a = ap.parse_args()
rc = 0
for m in a.models.split(","):
    p = subprocess.run([sys.executable, TEST, "--full", "--model", m])
    if p.returncode not in (0, 77):
        rc = p.returncode
sys.exit(rc)
