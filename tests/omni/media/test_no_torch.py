import subprocess
import sys
from pathlib import Path

import omni

_SCRIPT = """
import sys
import omni.media, omni.media.audio, omni.media.image, omni.media.limits
import omni.media.source, omni.media.video
leaked = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
print("torch modules:", leaked)
sys.exit(1 if leaked else 0)
"""


def test_media_never_imports_torch() -> None:
    root = Path(omni.__file__).resolve().parent.parent
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
