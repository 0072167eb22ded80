"""Every key of cluster.toml, one table per section: the validator accepts these and no others, and
docs/reference.md is written from them (`python -m homegpu.remote.config.reference docs/reference.md`).

To add a key: one Key in its section here (its example must validate: tests/test_reference.py tries each),
its parsing in the section's module, then run the command above.
"""

from __future__ import annotations

from homegpu.remote.config.durations import FORMS
from homegpu.remote.config.keys import Key, Section


def duration(span: str) -> str:
    """A duration key's type: every form it takes (durations.py), then its range."""
    return f"duration: {FORMS}; {span}"


CLUSTER = Section("[cluster]", (
    Key("name", "string", '`"home"`', "the cluster's name", 'name = "lab"'),
    Key("user", "string", "your `~/.ssh/config`, else login name", "SSH user for every node", 'user = "alice"'),
    Key("identity_file", "path", "what `~/.ssh/config`/ssh would pick", "SSH private key for every node",
        'identity_file = "~/.ssh/id_ed25519"'),
    Key("known_hosts", "path", '`"~/.ssh/known_hosts"`', "host keys are always verified against it",
        'known_hosts = "~/lab/known_hosts"'),
    Key("connect_timeout", duration("0.1 s–1 h"), "`10.0`", "per connection attempt", "connect_timeout = 20"),
    Key("keepalive_interval", duration("0.1 s–1 h"), "`5.0`", "SSH keepalive period", "keepalive_interval = 10"),
    Key("keepalive_count_max", "integer, 1–1000", "`3`", "unanswered keepalives before a node counts as offline",
        "keepalive_count_max = 5"),
    Key("stats_interval", duration("0.1 s–1 h"), "`1.0`", "GPU/CPU sampling period", "stats_interval = 2.0"),
    Key("work_dir", "path", '`"~/.homegpu"`', "where code, logs and pid files go on each node",
        'work_dir = "/scratch/homegpu"'),
    Key("price_per_kwh", "number, 0–1000", "none",
        "what a kWh costs: runs show their cost (without it, only their energy); see [Energy and cost](energy.md)",
        "price_per_kwh = 0.35"),
    Key("currency", "string, up to 8 characters", '`""`', 'shown after a cost: `"EUR"`, `"USD"`, `"€"`',
        'currency = "EUR"'),
    Key("tariffs", 'table of `"HH:MM-HH:MM" = price`', "none",
        "time-of-day rates (local time, end exclusive, may wrap midnight, may not overlap); `price_per_kwh` "
        "outside them. Needs `price_per_kwh`", 'tariffs = { "22:00-06:00" = 0.18 }'),
    Key("scheduler", '`"homegpu"` or `"slurm"`', '`"homegpu"`',
        "who starts the runs: homegpu itself on the nodes over SSH, or a lab's Slurm, one Slurm job per run "
        "submitted on `slurm_login` (see [Slurm](slurm.md): what works today). Needs `slurm_login`",
        'scheduler = "slurm"'),
    Key("slurm_login", "a node's name or an `~/.ssh/config` alias", 'required with `scheduler = "slurm"`',
        "the machine where `sbatch`, `squeue` and `scancel` run: a `[[nodes]]` name (its SSH settings) or a host "
        "or alias of its own; only with `scheduler = \"slurm\"`", 'slurm_login = "login.lab"'),
))

NODES = Section("[[nodes]]", (
    Key("name", "string", "required", "unique; letters, digits, `-`, `_`, `.`", 'name = "closet"'),
    Key("host", "string", "required", 'an address, an `~/.ssh/config` alias, or `"local"` for this machine',
        'host = "192.168.1.20"'),
    Key("port", "1–65535", "`~/.ssh/config`, else 22", "SSH port", "port = 2222"),
    Key("user", "string", "`[cluster].user`", "this node's SSH user, over the cluster's", 'user = "bob"'),
    Key("identity_file", "path", "`[cluster].identity_file`", "this node's SSH private key, over the cluster's",
        'identity_file = "~/.ssh/closet_ed25519"'),
    Key("address", "string", "where SSH reached it",
        "this node's address on the cluster network: TensorFlow and iperf3 traffic goes there. Unset, it is the "
        "address the SSH connection reached; for a node behind a gateway (`ProxyJump` in `~/.ssh/config`, whose "
        "connection has no address here) it is the ssh config's `HostName` when that is an address, else that "
        "name as the node resolves it, else the node's own address on its default route. `check`, `status`, "
        "`tfconfig` and `doctor` say which", 'address = "10.0.0.2"'),
    Key("runtime", '`"docker"` or `"process"`', '`"docker"`',
        "containers with GPUs passed through, or a plain Python process", 'runtime = "process"'),
    Key("python", "path", '`"python3"`', "the interpreter on the node (for the process runtime and the stats agent)",
        'python = "/home/alice/venv/bin/python"'),
    Key("work_dir", "path", "`[cluster].work_dir`", "per-node override", 'work_dir = "/data/homegpu"'),
    Key("tags", "list of strings", "`[]`", 'free labels, e.g. `["gpu", "rtx4090"]`', 'tags = ["gpu", "rtx4090"]'),
    Key("docker_socket", "path", '`"/var/run/docker.sock"`',
        "the node's Docker socket, which homegpu forwards over SSH for the docker runtime and doctor",
        'docker_socket = "/run/user/1000/docker.sock"'),
    Key("idle_watts", "number, 0–10000", "none",
        "what the machine draws besides its GPUs doing nothing; where RAPL cannot be read, the rest of the "
        "machine's energy is estimated from it (without it: GPU only)", "idle_watts = 45"),
    Key("busy_watts", "number, ≥ `idle_watts`", "`idle_watts`",
        "the same with every CPU busy: the estimate is linear in CPU use between the two; needs `idle_watts`",
        "busy_watts = 180"),
    Key("mac", '`"aa:bb:cc:dd:ee:ff"`', "none",
        "its wired NIC's MAC: homegpu can wake it with Wake-on-LAN ([Machines that sleep](sleep.md))",
        'mac = "a8:a1:59:0c:22:7e"'),
    Key("wake_via", "a node's name", "none (send from here)",
        "another node that sends the magic packet on its own LAN, for a controller on Wi-Fi, a VPN or another "
        "subnet; needs `mac`", 'wake_via = "desktop"'),
    Key("sleep_after", duration("10 s–1 w"), "off",
        "`homegpu serve` puts it to sleep after this long idle; needs `mac`", 'sleep_after = "30m"'),
    Key("sleep_command", "a command (split like a shell's words, run without one)", '`"systemctl suspend"`',
        "what puts it to sleep; run through `sudo -n` when its SSH user is not root",
        'sleep_command = "systemctl hibernate"'),
    Key("wake_timeout", duration("5 s–1 h"), '`"2m"`', "how long a boot may take before a wake is called failed",
        'wake_timeout = "5m"'),
))

JOBS = Section("[jobs.NAME]", (
    Key("image", "string", '`"homegpu/tensorflow:2.21"`; a PyTorch job: `"homegpu/pytorch:2.14"`; a JAX job: '
        '`"homegpu/jax:0.10"`',
        "image for Docker nodes (`homegpu image build` makes it from `assets/Dockerfile`; `--framework pytorch` "
        "from `assets/pytorch.Dockerfile`, `--framework jax` from `assets/jax.Dockerfile`)",
        'image = "homegpu/tensorflow:2.21"'),
    Key("python", "path", "the node's `python`", "interpreter for process nodes", 'python = "/opt/tf/bin/python"'),
    Key("script", "path", "none: the built-in trainer",
        "your entry file, relative to cluster.toml; it runs in the worker's output dir (`$HOMEGPU_OUTPUT_DIR`, "
        "writable in containers too), so relative writes such as a saved model land there; find files shipped "
        "beside it through `__file__`", 'script = "my_model/train.py"'),
    Key("code_dir", "path", "the script's folder",
        "the folder synced to every node (only changed files, less what is left out: see "
        "[Your own script](your-script.md#what-is-shipped); mounted read-only in containers)",
        'code_dir = "my_model"'),
    Key("args", "list of strings", "`[]`", "arguments for `script`", 'args = ["--lr", "0.01"]'),
    Key("framework", '`"tensorflow"`, `"pytorch"` or `"jax"`',
        '`"jax"` for a script that uses `jax.distributed`, or Keras with `KERAS_BACKEND` `"jax"` (in `env` or set '
        'by the script); `"pytorch"` for one that uses `torch.distributed` or DDP and imports no TensorFlow; else '
        '`"tensorflow"`',
        '`"pytorch"`: the `script` runs under torchrun on each node, a process per GPU (see '
        "[A PyTorch script](your-script.md#a-pytorch-script)); `workers_per_node` does not apply. `\"jax\"`: a "
        "process per worker, and `jax.distributed.initialize()` needs no arguments (see "
        "[A JAX script](your-script.md#a-jax-script))",
        'framework = "pytorch"'),
    Key("data", "string", '`"synthetic"`',
        'built-in trainer\'s data: `"synthetic"` (no download), `"npz:FILE"` (mnist format), `"dir:FOLDER"` '
        "(a folder per class); relative paths are under `data_dir`", 'data = "npz:mnist.npz"'),
    Key("model", '`"cnn"` or `"resnet"`; the PyTorch demo: `"mlp"` or `"cnn"`', '`"cnn"` (the PyTorch demo: `"mlp"`)',
        "built-in trainer's model; the PyTorch demo's CNN computes long enough per step that unlike machines' shares "
        "pay on a home LAN", 'model = "resnet"'),
    Key("data_dir", "path", "none", "a folder on every node, mounted read-only at `/data` in containers",
        'data_dir = "/srv/datasets"'),
    Key("env", "table of strings", "`{}`", "extra environment variables", 'env = { SEED = "3" }'),
    Key("nodes", "list of node names", "every node",
        "where workers run, in TF_CONFIG order: the first listed is the chief (it saves the model and holds the "
        "run lock); without it, every node in this file's order", 'nodes = ["desktop", "closet"]'),
    Key("workers_per_node", '`"per-gpu"` or integer, 1–64', "`1`",
        '`"per-gpu"`: one worker per GPU of each node, each seeing only its GPU, and one CPU worker on a node '
        "without GPUs; N: N workers per node, a GPU node's GPUs split evenly between them. Ports `port`, "
        "`port+1`, … on each node (all at most 65535). See [Mixed clusters](#mixed-clusters)",
        'workers_per_node = "per-gpu"'),
    Key("share_gpus", "boolean", "`false`",
        "let a node's workers share its GPUs when `workers_per_node` is larger than its GPU count (otherwise the "
        "launch is refused)", "share_gpus = true"),
    Key("port", "1–65535", "`23456`", "TensorFlow's worker port on each node's `address`", "port = 24000"),
    Key("epochs", "integer, 1–1,000,000", "`2`",
        "built-in trainer's schedule (a job with a `script` may not set it: its schedule is its own)", "epochs = 10"),
    Key("batch_size", "integer, 1–1,048,576", "`64` (per worker)", "built-in trainer's batch per worker (not with "
        "a `script`)", "batch_size = 128"),
    Key("steps_per_epoch", "integer, 0–1,000,000,000", "`0` (whole set)",
        "built-in trainer's steps per epoch (not with a `script`)", "steps_per_epoch = 100"),
    Key("restart", '`"on-failure"` or `"never"`', '`"on-failure"`',
        "on a failed or stalled worker, stop all and restart all with the next generation", 'restart = "never"'),
    Key("max_restarts", "integer, 0–1000", "`3`", "restarts before the run counts as failed", "max_restarts = 5"),
    Key("stall_timeout", duration("1 s–1 w"), "`300`", "a worker that prints nothing this long is stalled",
        'stall_timeout = "15m"'),
    Key("keras", '`"keras"` or `"tf-keras"`', '`"keras"`',
        "what your script's `import keras` gives on the workers: the node's own (Keras 3 on TensorFlow 2.16+, "
        "refused before launch under MultiWorkerMirroredStrategy on more than one worker), or tf-keras in its "
        "place, so a script written against the Keras 2 API trains unchanged. See "
        "[Your own script](your-script.md)", 'keras = "tf-keras"'),
    Key("reconnect_timeout", duration("1 s–1 w"), "`300`",
        "before a restart, how long to wait for a node that is away (rebooting, cut off); the run says it waits, "
        "and fails naming the node if it does not come back (unless `min_workers` lets it go on without it). "
        "Waiting uses up no restart", "reconnect_timeout = 600"),
    Key("min_workers", "integer, 1–1024", "every worker",
        "how few workers the run goes on with when machines leave for good: a node not back within "
        "`reconnect_timeout` (or refusing homegpu until someone acts) is left out and the others restart from the "
        "last finished epoch, the first node left the chief, spending no restart; fewer left fails the run. See "
        "[Running jobs](jobs.md#a-machine-that-leaves-for-good)", "min_workers = 2"),
    Key("on_fewer_workers", '`"keep-global-batch"` or `"keep-worker-batch"`', '`"keep-global-batch"`',
        "the built-in trainer's batch once workers left: the same global batch, each worker's share larger "
        "(refused when it does not split evenly), or each worker's batch as it was, the global one smaller (the "
        "learning rate may need to follow); only with `min_workers`", 'on_fewer_workers = "keep-worker-batch"'),
    Key("rejoin", "boolean", "`true`",
        "a node the run went on without that is back (online) rejoins: at the end of the epoch it came back in, "
        "everyone restarting with it from the chief's backup (`false`: at the run's next restart only)",
        "rejoin = false"),
    Key("checkpoint", "path in the script's working dir", "everything the chief wrote there",
        "what your script's chief saves and every worker resumes from (its snapshot: a file or a folder, relative "
        "to where the script runs): before each restart homegpu puts the chief's onto every other machine, so a "
        "script written for a shared filesystem resumes on every node from the same epoch. See "
        "[Your own script](your-script.md#resuming-after-a-restart)", 'checkpoint = "snapshot.pt"'),
    Key("balance", '`"speed"` or `"even"`', '`"speed"`',
        "each worker's share of a step's global batch (`batch_size` × workers, which stays as it is): by its "
        "measured pace (compute speed, and what a step costs it besides), re-split as paces change, so unlike "
        "machines add up; or the same for every worker. The built-in trainer and the PyTorch demo balance; a script "
        "of your own balances through homegpu's helper "
        "([Your own script](your-script.md#unlike-machines))", 'balance = "even"'),
    Key("gpu_memory", 'a size (`"5GiB"`, `"512MiB"`, `"8GB"`) or `"auto"`', "the whole card",
        "GPU memory each process of the job may hold on its card: TensorFlow, PyTorch and JAX are held to it, so "
        "runs that share a card cannot starve each other, and a run that goes over it fails naming this key. "
        '`"auto"`: the most its last run held on a GPU, plus a tenth. A plan whose processes cannot fit their '
        "cards is refused before launch ([Sharing a GPU](sharing-a-gpu.md))", 'gpu_memory = "5GiB"'),
    Key("partition", "a Slurm partition (several: comma-separated)", "Slurm's default partition",
        '`sbatch --partition`: where the run\'s Slurm job goes (`sinfo` lists them). Only with `scheduler = "slurm"`, '
        "like the four keys below ([Slurm](slurm.md))", 'partition = "gpu"'),
    Key("account", "a Slurm account", "your default account", "`sbatch --account`: who the run is charged to",
        'account = "vision"'),
    Key("qos", "a Slurm QOS", "the account's default", "`sbatch --qos`: the quality of service it runs under",
        'qos = "normal"'),
    Key("time_limit", 'Slurm\'s own forms, not a duration: `"MM"`, `"MM:SS"`, `"HH:MM:SS"`, `"D-HH"`, `"D-HH:MM"` or '
        '`"D-HH:MM:SS"`, up to a year (sbatch is handed it as written)',
        "the partition's default", "`sbatch --time`: Slurm ends the run after it; kept as Slurm prints a limit "
        '(`"90"` is `1:30:00`)', 'time_limit = "12:00:00"'),
    Key("gres", '`"NAME[:TYPE][:COUNT]"`, comma-separated', "the GPUs the device plan gives each node",
        '`sbatch --gres`, per node: e.g. `"gpu:1"`, `"gpu:rtx4090:2"`', 'gres = "gpu:rtx4090:2"'),
))

ALERTS = Section("[alerts]", (
    Key("gpu_temperature", "°C, 1–150", "off",
        "a GPU at or above it; clears at 5 °C below (so a GPU hovering at the threshold does not flap)",
        "gpu_temperature = 85"),
    Key("gpu_memory_percent", "%, 1–100", "off",
        "a GPU with this much of its memory in use; clears 5 points below. TensorFlow takes most of a GPU's memory "
        "when it starts unless memory growth is on, so set it high", "gpu_memory_percent = 98"),
    Key("node_offline_seconds", duration("1 s–1 w"), "off",
        'a node that was online has been unreachable (offline, reconnecting, refused) this long; clears when it is '
        'back. A node that never connected is not "offline": the TUI and preflight say why it cannot',
        "node_offline_seconds = 60"),
    Key("job_failed", "boolean", "`false`", "the run failed (after its restarts), with the reason", "job_failed = true"),
    Key("job_stalled", "boolean", "`false`",
        "the controller's stall watchdog fired: a worker printed nothing for the job's `stall_timeout`, so the run "
        "restarts (or fails); clears when a worker makes progress again", "job_stalled = true"),
    Key("straggler", "boolean", "`false`",
        "the controller flagged a worker whose examples/s (steps/s for a Keras script) for an epoch is below 60% "
        "of the median of the others' (the message adds what holds its GPUs back, where anything does: "
        "[Why a GPU is slow](slow-gpu.md)); clears when the next epoch passes without it being flagged",
        "straggler = true"),
    Key("job_succeeded", "boolean", "`false`", "the run finished: every worker succeeded", "job_succeeded = true"),
    Key("run_shrunk", "boolean", "`false`",
        "the run went on without a machine that left for good (the job's `min_workers`), naming it and who goes on",
        "run_shrunk = true"),
    Key("queued_runs", "boolean", "`false`",
        "a run of `homegpu serve`'s queue, named with its `--set` values (`q-12 (train epochs=20) started as run "
        "…`): `queued_run_started` (with its run id), `queued_run_succeeded`, `queued_run_failed` and "
        "`queued_run_cancelled` (with the reason), once per entry and state", "queued_runs = true"),
    Key("budget_per_day", "money, 0–1000000", "off",
        "the cluster's electricity since local midnight (its GPUs', and the rest of the machines' where RAPL or "
        "`idle_watts` gives it), priced by `[cluster]`'s tariff, has cost this much (each step between samples, "
        "as the run summary counts it); once a day, cleared at midnight. Needs `price_per_kwh`",
        "budget_per_day = 2.50"),
    Key("budget_per_run", "money, 0–1000000", "off",
        "the GPUs a run's workers are on have cost this much in electricity while it runs; once per run. Needs "
        "`price_per_kwh`", "budget_per_run = 1.00"),
    Key("command", "list of strings", "none: alerts are only shown",
        "run on the machine that runs homegpu for every alert and every clear, without a shell; its arguments may "
        "hold placeholders ([the command](#the-command))", 'command = ["notify-send", "{title}", "{message}"]'),
    Key("command_timeout", duration("1 s–1 h"), "`30`", "then the command and whatever it started are killed",
        "command_timeout = 60"),
    Key("notify", "list of Apprise URLs, or of `{ url = \"…\", alerts = [\"…\"] }`", "none",
        "every alert and its clear sent to each URL (ntfy, Telegram, Discord, Slack, Matrix, mail and about a hundred "
        "more: [Notifications](notifications.md)), with the title and message the command gets; with `alerts`, "
        "only those rules' (their names as above). A URL's secrets are never shown",
        'notify = ["ntfys://ntfy.sh/my-homegpu", { url = "mailto://me:pw@example.com", alerts = ["job_failed"] }]'),
))

SECTIONS = (CLUSTER, NODES, JOBS, ALERTS)
