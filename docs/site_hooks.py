"""MkDocs hooks of the documentation site (mkdocs.yml): the README is the home page.

The README and the guides are written for the repository and the package index, so their
links are the repository's: the README's are absolute (to render on the index), the
guides' are relative and some leave ``docs/``. On the site, a link into ``docs/`` becomes
the site's page, the README the home page, and any other file the repository's.
"""

import os
import re

from mkdocs.structure.files import File

REPO = "https://github.com/top1-jax/top1_jax"
_IN_DOCS = re.compile(
  r"(?:https://github\.com/top1-jax/top1_jax/blob/main"
  r"|https://raw\.githubusercontent\.com/top1-jax/top1_jax/main)/docs/"
)
_LEAVING_DOCS = re.compile(r"(\]\(|src=\")((?:\.\./)+)([^)\"#\s]+)")


def on_files(files, config):
  """Adds the README as the home page (index.md)."""
  readme = os.path.join(os.path.dirname(config.config_file_path), "README.md")
  with open(readme, encoding="utf-8") as f:
    files.append(File.generated(config, "index.md", content=f.read()))
  return files


def on_page_markdown(markdown, page, config, files):
  """Points links into docs/ at the site's pages and links leaving docs/ at the repository."""
  depth = page.file.src_uri.count("/")
  markdown = _IN_DOCS.sub("../" * depth, markdown)

  def repository(match):
    ups, target = len(match.group(2)) // 3, match.group(3)
    if ups <= depth:  # still inside docs/
      return match.group(0)
    if target == "README.md" and ups == depth + 1:
      return f"{match.group(1)}{'../' * depth}index.md"
    return f"{match.group(1)}{REPO}/blob/main/{target}"

  return _LEAVING_DOCS.sub(repository, markdown)
