"""What a run reports about itself: trackers (console, jsonl, tensorboard, wandb, mlflow), where each step's time
went (perf), the utilisation report and plots. Used by the trainer loops; imports no worker or engine."""
