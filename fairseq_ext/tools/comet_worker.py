"""COMET's scoring, run by the Python of an environment that has ``unbabel-comet`` (never
imported by fairseq_ext, whose environment cannot hold COMET's pins: numpy < 2, protobuf < 5):

    COMET_PYTHON -c "$(cat comet_worker.py)" REQUEST.json RESULT.json   (in a folder of its own)

REQUEST: {"model": a checkpoint file (.ckpt) or a model name for COMET's download, "src", "hyp",
"ref": text files, one segment a line, "batch_size", "gpus": 0 or 1, "progress": bool}.
RESULT: {"system_score", "segment_scores", "comet_version", "checkpoint"}, as ``comet-score``
computes them. Standard library and
COMET only: this file runs outside the package.
"""
import json
import logging
import sys
from importlib.metadata import version


def read(path):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def main(request_path, result_path):
    with open(request_path, encoding="utf-8") as f:
        request = json.load(f)
    for name in ("pytorch_lightning", "lightning", "lightning.pytorch", "comet"):
        logging.getLogger(name).setLevel(logging.ERROR)
    import torch
    from comet import download_model, load_from_checkpoint

    checkpoint = request["model"]
    if not checkpoint.endswith(".ckpt"):
        checkpoint = download_model(checkpoint)  # COMET's own: its hub, or its cache
    # as comet-score computes its scores (COMET 2.2): the model in half precision, seed 1
    from pytorch_lightning import seed_everything

    torch.set_float32_matmul_precision("high")
    seed_everything(1, verbose=False)
    model = load_from_checkpoint(checkpoint)
    model.eval()
    model.half()
    src, hyp, ref = (read(request[k]) for k in ("src", "hyp", "ref"))
    samples = [{"src": s, "mt": h, "ref": r} for s, h, r in zip(src, hyp, ref)]
    gpus = 1 if request["gpus"] and torch.cuda.is_available() else 0
    out = model.predict(samples, batch_size=request["batch_size"], gpus=gpus, progress_bar=request["progress"],
                        accelerator="gpu" if gpus else "cpu")
    result = {"system_score": float(out.system_score), "segment_scores": [float(s) for s in out.scores],
              "comet_version": version("unbabel-comet"), "checkpoint": str(checkpoint), "gpus": gpus}
    with open(result_path, "w", encoding="utf-8") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:3])
