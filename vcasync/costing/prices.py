"""Hourly prices of a few cloud instance types, on-demand and spot/preemptible.

These are **list prices as published by each provider on the page named in ``source``, as of the
date in ``as_of``**, for Linux, in USD, in the region named. They drift: on-demand prices change
rarely, spot prices move daily (AWS, Azure) or up to monthly (GCP Spot VMs). Entries marked
``approximate`` quote a spot price that the provider's page shows as a moving market figure, so
the number is a representative snapshot rather than a fixed list price. Every figure can be
overridden (``PriceTable.with_override`` or ``vcasync simulate --spot-price/--on-demand-price``):
check the provider's page before trusting a saving computed from these. A row whose spot price is
above its on-demand price is kept (a price spike may be modelled on purpose) with a warning naming it.

The GCP figures are built from the per-vCPU and per-GiB rates of the page (predefined N1/N2 machine
types are billed as vCPUs plus memory since October 2018). The two GCP rows dated 2021-01 are the
paper's era (preemptible VMs, fixed prices); the rows dated 2024-06 are today's kind of market (Spot
VMs, GPU types) and are ``approximate``: they were copied from the providers' pages as of that month
and could not be re-checked from a machine without network access. Bring your own with
``--prices FILE`` (:meth:`PriceTable.from_file`: JSON, TOML or CSV rows of :class:`InstancePrice`
fields, each field checked when the row is built; a bad one names the file, the row and the field).
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import logging
import tomllib
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from ..coerce import is_finite_number
from ..errors import ConfigError, PriceRowError
from .params import MAX_INPUT_FILE_ROWS, csv_records, read_text_file, too_many_rows

log = logging.getLogger("vcasync.costing")

__all__ = [
    "DEFAULT_COORDINATOR_INSTANCE", "DEFAULT_INSTANCE", "DEFAULT_PRICES", "MAX_MIN_BILLED_S",
    "MAX_PRICE_PER_H",
    "InstancePrice", "PriceTable",
]

#: The most a price row may say an instance costs per hour, on demand or spot (USD): above the
#: largest cloud instances' list prices (8-GPU machines are ~$100/h) with room to spare, and far
#: below where a run's cost overflows to inf.
MAX_PRICE_PER_H = 10_000.0
#: The longest billing minimum a price row may give: one day.
MAX_MIN_BILLED_S = 86_400.0


@dataclass(frozen=True, slots=True)
class InstancePrice:
    """What one instance type costs per hour, and where the figures come from."""

    provider: str
    instance: str
    region: str
    vcpus: float
    memory_gib: float
    on_demand_per_h: float
    spot_per_h: float
    source: str
    as_of: str
    min_billed_s: float = 60.0
    approximate: bool = False
    note: str = ""
    accelerator: str = ""

    def __post_init__(self) -> None:
        # Every field is checked here, where a row is built from a file or in code: a price file
        # with ``"provider": 5`` or ``"instance": [1]`` was accepted and crashed --list-prices with
        # a TypeError, ``"approximate": "yes"`` counted as true, and a NaN ``min_billed_s`` removed
        # the billing minimum without a word (``max(uptime, nan)``).
        for name in ("provider", "instance", "region", "source", "as_of"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise self._bad(f"{name} must be a non-empty string, got {value!r}")
        for name in ("note", "accelerator"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise self._bad(f"{name} must be a string, got {value!r}")
        if not isinstance(self.approximate, bool):
            raise self._bad(f"approximate must be true or false, got {self.approximate!r}")
        # fractional vCPUs are real (GCP's shared-core e2-micro has 0.25)
        # the upper bounds: a finite 1e308 $/h passed, and the summary said "$inf" and "saving nan %"
        for name, what, low, strict, high in (
                ("vcpus", "number", 0.0, True, None), ("memory_gib", "number", 0.0, True, None),
                ("on_demand_per_h", "price", 0.0, False, MAX_PRICE_PER_H),
                ("spot_per_h", "price", 0.0, False, MAX_PRICE_PER_H),
                ("min_billed_s", "number of seconds", 0.0, False, MAX_MIN_BILLED_S)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise self._bad(f"{name} must be a number, got {value!r}")
            if not is_finite_number(value, low, strict=strict, high=high):
                upto = f" and <= {high:,g}" if high is not None else ""
                raise self._bad(f"{name} must be a finite {what} "
                                f"{'>' if strict else '>='} {low:g}{upto}, got {value!r}")
        if self.on_demand_per_h == 0:   # spot may be free (volunteers); the reference may not
            raise self._bad("on_demand_per_h must be > 0: every saving is measured against it")
        if self.spot_per_h > self.on_demand_per_h:   # allowed (a spike may be modelled), never silent
            log.warning("price row %s: spot $%g/h is above on-demand $%g/h, so running spot costs more "
                        "and every saving against on-demand comes out negative", self.key,
                        self.spot_per_h, self.on_demand_per_h)

    def _bad(self, problem: str) -> PriceRowError:
        """The error for a bad field, naming the row by ``provider:instance`` once both are names."""
        ok = all(isinstance(v, str) and v.strip() for v in (self.provider, self.instance))
        return PriceRowError(problem, key=self.key if ok else None)

    @property
    def key(self) -> str:
        return f"{self.provider}:{self.instance}"

    @property
    def spot_discount(self) -> float:
        """Fraction saved per hour by running spot instead of on-demand."""
        return 1.0 - self.spot_per_h / self.on_demand_per_h if self.on_demand_per_h else 0.0

    def billed_seconds(self, uptime_s: float) -> float:
        """Seconds billed for one instance run of ``uptime_s`` (per-second billing after a minimum)."""
        if uptime_s <= 0:
            return 0.0
        return max(uptime_s, self.min_billed_s)

    def cost(self, uptime_s: float, *, spot: bool) -> float:
        """USD for one instance run of ``uptime_s`` seconds."""
        rate = self.spot_per_h if spot else self.on_demand_per_h
        return self.billed_seconds(uptime_s) / 3600.0 * rate

    def as_dict(self) -> dict[str, object]:
        return {
            "provider": self.provider, "instance": self.instance, "region": self.region,
            "vcpus": self.vcpus, "memory_gib": self.memory_gib,
            "on_demand_per_h": self.on_demand_per_h, "spot_per_h": self.spot_per_h,
            "source": self.source, "as_of": self.as_of, "min_billed_s": self.min_billed_s,
            "approximate": self.approximate, "note": self.note, "accelerator": self.accelerator,
        }


_GCP_VM = "Google Cloud, 'VM instance pricing' (cloud.google.com/compute/vm-instance-pricing)"
_AWS_OD = "Amazon EC2 On-Demand Pricing (aws.amazon.com/ec2/pricing/on-demand)"
_AWS_SPOT = "Amazon EC2 Spot Instances Pricing (aws.amazon.com/ec2/spot/pricing)"
_GCP_GPU = "Google Cloud, 'GPU pricing' (cloud.google.com/compute/gpus-pricing)"
_AZ = "Azure Linux Virtual Machines Pricing (azure.microsoft.com/pricing/details/virtual-machines/linux)"

DEFAULT_PRICES: tuple[InstancePrice, ...] = (
    # GCP us-central1: N1 and N2 on-demand $0.031611 / vCPU-h + $0.004237 / GiB-h; preemptible
    # N1 $0.006655 / vCPU-h + $0.000892 / GiB-h, N2 $0.00765 / vCPU-h + $0.001025 / GiB-h.
    InstancePrice("gcp", "n1-standard-8", "us-central1", 8, 30.0, 0.379998, 0.080000,
                  _GCP_VM + ", on-demand and preemptible rates", "2021-01",
                  note="the paper's era (2021 preemptible VMs); "
                       "8 x 0.031611 + 30 x 0.004237; preemptible 8 x 0.006655 + 30 x 0.000892"),
    InstancePrice("gcp", "n2-standard-8", "us-central1", 8, 32.0, 0.388472, 0.093999,
                  _GCP_VM + ", on-demand and preemptible rates", "2021-01",
                  note="the paper's era (2021 preemptible VMs); "
                       "8 x 0.031611 + 32 x 0.004237; preemptible 8 x 0.00765 + 32 x 0.001025"),
    InstancePrice("gcp", "n2d-standard-8", "us-central1", 8, 32.0, 0.338, 0.0820,
                  _GCP_VM + ", on-demand and Spot VM rates", "2024-06", approximate=True,
                  note="Spot VM prices may change up to once a month"),
    InstancePrice("gcp", "n1-standard-4+t4", "us-central1", 4, 15.0, 0.54, 0.1476,
                  f"{_GCP_VM}; {_GCP_GPU}", "2024-06", approximate=True, accelerator="1 x NVIDIA T4",
                  note="n1-standard-4 plus one T4, on-demand 0.19 + 0.35; Spot VM rates for both"),
    # A small machine for the coordinator (it merges and serves; it does not train).
    InstancePrice("gcp", "e2-standard-2", "us-central1", 2, 8.0, 0.067006, 0.020102,
                  _GCP_VM + ", on-demand and preemptible rates", "2021-01",
                  note="2 x 0.021811 + 8 x 0.002923; preemptible 2 x 0.006543 + 8 x 0.000877"),
    InstancePrice("aws", "m5.2xlarge", "us-east-1", 8, 32.0, 0.384, 0.1280,
                  f"{_AWS_OD}; spot: {_AWS_SPOT}", "2024-06", approximate=True,
                  note="spot is a market price that moves hourly per availability zone"),
    InstancePrice("aws", "c5.2xlarge", "us-east-1", 8, 16.0, 0.340, 0.1200,
                  f"{_AWS_OD}; spot: {_AWS_SPOT}", "2024-06", approximate=True,
                  note="spot is a market price that moves hourly per availability zone"),
    InstancePrice("aws", "g4dn.xlarge", "us-east-1", 4, 16.0, 0.526, 0.1578,
                  f"{_AWS_OD}; spot: {_AWS_SPOT}", "2024-06", approximate=True, accelerator="1 x NVIDIA T4",
                  note="spot is a market price that moves hourly per availability zone"),
    InstancePrice("azure", "D8s_v5", "eastus", 8, 32.0, 0.384, 0.0768,
                  _AZ + ", pay-as-you-go and spot", "2024-06", approximate=True,
                  note="spot price varies with capacity; shown as published for the region"),
    InstancePrice("azure", "NC4as_T4_v3", "eastus", 4, 28.0, 0.526, 0.1578,
                  _AZ + ", pay-as-you-go and spot", "2024-06", approximate=True, accelerator="1 x NVIDIA T4",
                  note="spot price varies with capacity; shown as published for the region"),
)

#: The instance type used when none is named: fixed list prices (not a moving spot market).
DEFAULT_INSTANCE = "gcp:n1-standard-8"
#: The machine the coordinator runs on, always on-demand (it must not be preempted).
DEFAULT_COORDINATOR_INSTANCE = "gcp:e2-standard-2"


class PriceTable(Mapping[str, InstancePrice]):
    """Instance prices by ``provider:instance`` (a bare instance name works when it is unique)."""

    __slots__ = ("_by_key",)

    def __init__(self, prices: tuple[InstancePrice, ...] | list[InstancePrice] = DEFAULT_PRICES) -> None:
        self._by_key: dict[str, InstancePrice] = {}
        for p in prices:
            if p.key in self._by_key:
                raise ConfigError(f"price table lists {p.key!r} twice")
            self._by_key[p.key] = p

    def __getitem__(self, key: str) -> InstancePrice:
        return self._by_key[self.resolve(key)]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_key)

    def __len__(self) -> int:
        return len(self._by_key)

    def resolve(self, name: str) -> str:
        """The full key for ``name`` (``gcp:n1-standard-8`` or ``n1-standard-8``); ConfigError if unknown."""
        if name in self._by_key:
            return name
        matches = [k for k, p in self._by_key.items() if p.instance == name]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise ConfigError(f"instance {name!r} is ambiguous: say one of {matches}")
        # a table without the default coordinator's row (a --price-table of one's own instances)
        # was refused with no word that the missing instance was the coordinator's, nor which flag
        # chooses another
        hint = ("; it is the coordinator's instance (the default): choose one the table has with "
                "--coordinator-instance, or add a row for it with --prices FILE"
                if name == DEFAULT_COORDINATOR_INSTANCE else
                "; it is the workers' instance (the default): choose one the table has with --instance, "
                "or add a row for it with --prices FILE" if name == DEFAULT_INSTANCE else
                " (add one with --prices FILE or override the prices)")
        raise ConfigError(f"no price for instance {name!r}; known: {sorted(self._by_key)}{hint}")

    def with_override(self, name: str, *, on_demand_per_h: float | None = None,
                      spot_per_h: float | None = None, source: str = "user override") -> PriceTable:
        """A new table where ``name``'s prices are replaced (``source``/``as_of`` say so)."""
        key = self.resolve(name)
        old = self._by_key[key]
        changes: dict[str, object] = {}
        if on_demand_per_h is not None:
            changes["on_demand_per_h"] = float(on_demand_per_h)
        if spot_per_h is not None:
            changes["spot_per_h"] = float(spot_per_h)
        if not changes:
            return self
        new = replace(old, source=source, as_of="run time", approximate=False,
                      note=f"overrides {old.source} ({old.as_of})", **changes)  # type: ignore[arg-type]
        return PriceTable([new if k == key else p for k, p in self._by_key.items()])

    def merged(self, other: PriceTable) -> PriceTable:
        """This table with ``other``'s rows added, replacing rows of the same ``provider:instance``."""
        rows = dict(self._by_key)
        rows.update({k: other[k] for k in other})
        return PriceTable(list(rows.values()))

    @classmethod
    def from_file(cls, path: str | Path) -> PriceTable:
        """Rows from a JSON list (or ``{"prices": [...]}``), a TOML file of ``[[prices]]`` tables,
        or a ``.csv`` file with a header row of field names (empty cells: the field's default;
        spaces around a name or cell are not part of it). A TOML date for ``as_of`` reads as its
        ISO string (``2026-11-01``).

        A bad row is a :class:`ConfigError` naming the file, the row (``line N`` of a CSV file, as
        an editor numbers it; ``price row N``, counted from 1, of a JSON or TOML list) and the field."""
        p = Path(path)
        text = read_text_file(p, "price file")
        fmt = {".toml": "TOML", ".csv": "CSV"}.get(p.suffix.lower(), "JSON")
        labels: list[str] | None = None
        try:
            if fmt == "CSV":
                lines, csv_rows = _csv_rows(text)
                doc: object = csv_rows
                labels = [f"line {n}" for n in lines]
            else:
                doc = _toml_rows(text) if fmt == "TOML" else json.loads(text)
        except (tomllib.TOMLDecodeError, json.JSONDecodeError, csv.Error) as exc:
            raise ConfigError(f"price file {str(p)!r} is not valid {fmt}: {exc}") from None
        except ConfigError as exc:      # a CSV cell that is not of its field's type
            raise ConfigError(f"price file {str(p)!r}: {exc}") from None
        rows = doc.get("prices") if isinstance(doc, dict) else doc
        if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
            raise ConfigError(f"price file {str(p)!r} must hold a non-empty list of price rows "
                              '(JSON: [{...}] or {"prices": [...]}; TOML: [[prices]] tables; CSV: a '
                              "header row and a row per instance)")
        if len(rows) > MAX_INPUT_FILE_ROWS:     # (a CSV file's were counted as they were read)
            raise too_many_rows(f"price file {str(p)!r}: {len(rows):,} price rows")
        try:
            return cls.from_rows(rows, labels=labels)
        except ConfigError as exc:
            raise ConfigError(f"price file {str(p)!r}: {exc}") from None

    @classmethod
    def from_rows(cls, rows: list[Mapping[str, object]], *, labels: list[str] | None = None) -> PriceTable:
        """Build a table from JSON-like rows (the fields of :class:`InstancePrice`); an error names
        the row by ``labels[i]`` (default ``price row i+1``) and the field."""
        prices: list[InstancePrice] = []
        seen: dict[str, str] = {}    # key -> where its row is
        fields = set(InstancePrice.__dataclass_fields__)
        for i, row in enumerate(rows):
            where = labels[i] if labels is not None else f"price row {i + 1}"
            unknown = sorted(set(row) - fields)
            if unknown:
                raise PriceRowError(f"unknown field(s) {unknown}", where=where)
            missing = sorted(f for f in ("provider", "instance", "region", "vcpus", "memory_gib",
                                         "on_demand_per_h", "spot_per_h", "source", "as_of") if f not in row)
            if missing:
                raise PriceRowError(f"missing field(s) {missing}", where=where)
            try:
                prices.append(InstancePrice(**row))  # type: ignore[arg-type]
            except PriceRowError as exc:
                # one prefix, the file's place, with the row's key when it has one (was "price row
                # 1: price row acme:big-8: ...")
                raise exc.at(where) from None
            except TypeError as exc:
                raise PriceRowError(str(exc), where=where) from None
            key = prices[-1].key
            if key in seen:
                # both rows by place: "price table lists 'acme:big-8' twice" left a long file's
                # reader to find them
                raise PriceRowError(f"listed twice, first on {seen[key]}: give one row per "
                                    "provider:instance", key=key, where=where)
            seen[key] = where
        return cls(prices)


def _toml_rows(text: str) -> object:
    """A TOML price file, its bare dates (``as_of = 2026-11-01``, TOML's own date type, where JSON
    and CSV can only write a string) read as the ISO strings ``as_of`` holds: such a row was
    refused with "as_of must be a non-empty string, got datetime.date(2026, 11, 1)"."""
    doc = tomllib.loads(text)
    rows = doc.get("prices")
    for row in rows if isinstance(rows, list) else ():
        if isinstance(row, dict) and isinstance(row.get("as_of"), (dt.date, dt.time)):
            row["as_of"] = row["as_of"].isoformat()
    return doc


#: What a CSV cell of a true/false field may say (anything else is refused, not read as false).
_CSV_BOOLS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


def _csv_rows(text: str) -> tuple[list[int], list[dict[str, object]]]:
    """A CSV price file's rows as the JSON rows ``from_rows`` takes, and the line each ends on: each
    cell read as its :class:`InstancePrice` field's type (numbers as numbers, true/false/yes/no/1/0
    for a true/false field), empty cells left out (the field's default, or "missing" for a required
    one). A cell that is not of its type is a :class:`ConfigError` naming its line and field."""
    hints = typing.get_type_hints(InstancePrice)
    rows: list[dict[str, object]] = []
    lines: list[int] = []
    _, records = csv_records(text, "line ", strict=True)
    for line, raw in records:
        row: dict[str, object] = {}
        for name, cell in raw.items():
            cell = (cell or "").strip()
            if not cell:
                continue
            hint = hints.get(name, str)     # an unknown field is named by from_rows
            if hint is bool:
                if cell.lower() not in _CSV_BOOLS:
                    raise ConfigError(f"line {line}: {name} = {cell!r} is not a true/false value "
                                      "(true/false, yes/no or 1/0)")
                row[name] = _CSV_BOOLS[cell.lower()]
            elif hint in (int, float):
                try:
                    number = float(cell)
                except ValueError:
                    raise ConfigError(f"line {line}: {name} = {cell!r} is not a number") from None
                row[name] = int(number) if name == "vcpus" and number.is_integer() else number
            else:
                row[name] = cell
        rows.append(row)
        lines.append(line)
    return lines, rows
