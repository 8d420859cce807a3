#include "top/dashboard.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <langinfo.h>
#include <locale.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <vector>

// Last: curses defines macros with common names; NCURSES_NOMACROS keeps them out.
#define NCURSES_NOMACROS
#include <curses.h>

namespace vramscope::cli::top {
namespace {

constexpr int kKeyCtrlD = 4;
constexpr int kKeyEscape = 27;
constexpr int kPairTitle = 1;
constexpr int kPairAllocated = 2;
constexpr int kPairReserved = 3;
constexpr int kPairWarning = 4;

// The eighths blocks, from 1/8 to 8/8, in UTF-8.
const char* const kEighths[] = {"\u2581", "\u2582", "\u2583", "\u2584",
                                "\u2585", "\u2586", "\u2587", "\u2588"};
const char* const kShade = "\u2591";

void Put(int y, int x, std::string_view text, int max_width) {
  if (max_width <= 0) return;
  mvwaddnstr(
      stdscr, y, x, text.data(),
      static_cast<int>(std::min<std::size_t>(text.size(), static_cast<std::size_t>(max_width))));
}

std::string Clock(std::uint64_t time_ns) {
  const time_t seconds = static_cast<time_t>(time_ns / 1000000000u);
  struct tm tm;
  localtime_r(&seconds, &tm);
  char buf[16];
  std::strftime(buf, sizeof(buf), "%H:%M:%S", &tm);
  return buf;
}

}  // namespace

Dashboard::Dashboard(std::string source) : source_(std::move(source)) {}

Dashboard::~Dashboard() { Stop(); }

bool Dashboard::Start() {
  setlocale(LC_ALL, "");
  unicode_ = strcmp(nl_langinfo(CODESET), "UTF-8") == 0;
  SCREEN* screen = newterm(nullptr, stdout, stdin);
  if (screen == nullptr) {
    const char* term = getenv("TERM");
    std::fprintf(stderr,
                 "vramscope: cannot use the terminal (TERM=%s); use --plain for plain lines\n",
                 term != nullptr ? term : "(unset)");
    return false;
  }
  set_term(screen);
  started_ = true;
  cbreak();
  noecho();
  keypad(stdscr, TRUE);
  curs_set(0);
  set_escdelay(25);
  if (has_colors()) {
    start_color();
    use_default_colors();
    init_pair(kPairTitle, COLOR_CYAN, -1);
    init_pair(kPairAllocated, COLOR_GREEN, -1);
    init_pair(kPairReserved, COLOR_YELLOW, -1);
    init_pair(kPairWarning, COLOR_RED, -1);
    colors_ = true;
  }
  return true;
}

void Dashboard::Stop() {
  if (!started_) return;
  started_ = false;
  endwin();
}

InputResult Dashboard::HandleInput(TopModel& model, int timeout_ms) {
  wtimeout(stdscr, timeout_ms);
  const int key = wgetch(stdscr);
  if (key == ERR) return InputResult::kNone;
  if (key == KEY_RESIZE) return InputResult::kChanged;
  if (show_help_) {
    show_help_ = false;
    return InputResult::kChanged;
  }
  if (editing_filter_) {
    std::string filter = model.filter();
    if (key == '\n' || key == '\r' || key == KEY_ENTER) {
      editing_filter_ = false;
    } else if (key == kKeyEscape) {
      editing_filter_ = false;
      model.SetFilter(filter_before_edit_);
    } else if (key == KEY_BACKSPACE || key == 127 || key == 8) {
      if (!filter.empty()) filter.pop_back();
      model.SetFilter(filter);
    } else if (key >= 32 && key < 127) {
      filter.push_back(static_cast<char>(key));
      model.SetFilter(filter);
    }
    return InputResult::kChanged;
  }
  switch (key) {
    case 'q':
    case 'Q':
    case kKeyCtrlD:
      return InputResult::kQuit;
    case 's':
    case KEY_F(6):
      model.CycleSort();
      break;
    case 'r':
      model.ReverseSort();
      break;
    case '/':
      editing_filter_ = true;
      filter_before_edit_ = model.filter();
      break;
    case kKeyEscape:
      model.SetFilter("");
      break;
    case KEY_DOWN:
    case 'j':
      model.MoveSelection(1);
      break;
    case KEY_UP:
    case 'k':
      model.MoveSelection(-1);
      break;
    case KEY_NPAGE:
      model.MoveSelection(std::max(1, table_height_ - 1));
      break;
    case KEY_PPAGE:
      model.MoveSelection(-std::max(1, table_height_ - 1));
      break;
    case KEY_HOME:
    case 'g':
      model.SelectFirst();
      break;
    case KEY_END:
    case 'G':
      model.SelectLast();
      break;
    case 't':
      model.ToggleGraphTotal();
      break;
    case '?':
    case 'h':
    case KEY_F(1):
      show_help_ = true;
      break;
    default:
      return InputResult::kNone;
  }
  return InputResult::kChanged;
}

void Dashboard::Draw(const TopModel& model, std::string_view status) {
  if (!started_) return;
  const int height = getmaxy(stdscr);
  const int width = getmaxx(stdscr);
  werase(stdscr);
  if (height < 6 || width < 40) {
    Put(0, 0, absl::StrFormat("terminal %dx%d too small (80x24 wanted)", width, height), width);
    wrefresh(stdscr);
    return;
  }
  // Title: what is watched, how much, sort, filter; the time on the right.
  const std::string clock = model.has_data() ? Clock(model.time_ns()) : "--:--:--";
  // The filter goes on the last line: the title must fit 80 columns with the longest sort name.
  const std::string title = absl::StrCat("vramscope top  ", source_, "  ", model.processes(),
                                         " proc  sort: ", SortColumnName(model.sort()),
                                         model.descending() ? " (desc)" : " (asc)");
  if (colors_) wattron(stdscr, COLOR_PAIR(kPairTitle) | A_BOLD);
  Put(0, 0, Fit(title, static_cast<std::size_t>(width) - clock.size() - 1), width);
  Put(0, width - static_cast<int>(clock.size()), clock, static_cast<int>(clock.size()));
  if (colors_) wattroff(stdscr, COLOR_PAIR(kPairTitle) | A_BOLD);

  // This machine's GPUs as NVML sees them (none without NVML), at most a sixth of the screen;
  // a cut list says how many GPUs it leaves out.
  std::vector<std::string> gpus = model.GpuLines(static_cast<std::size_t>(width));
  const std::size_t gpu_room = static_cast<std::size_t>(std::max(1, (height - 5) / 6));
  if (gpus.size() > gpu_room) {
    const std::size_t more = gpus.size() - (gpu_room - 1);
    gpus.resize(gpu_room - 1);
    gpus.push_back(absl::StrCat("... and ", more, " more GPUs (--plain lists every GPU)"));
  }
  for (std::size_t i = 0; i < gpus.size(); ++i) {
    Put(1 + static_cast<int>(i), 0, gpus[i], width);
  }
  const int gpu_lines = static_cast<int>(gpus.size());

  // Everything but the table has a fixed share; the table gets the rest.
  // Title, table header, graph title, details title, status, the GPU lines.
  const int available = height - 5 - gpu_lines;
  const int details = std::min(5, available / 4);
  const int graph = std::clamp(available / 3, 1, 10);
  const int table = std::max(1, available - details - graph);
  DrawTable(model, 1 + gpu_lines, table + 1, width);
  DrawGraph(model, 2 + gpu_lines + table, graph + 1, width);
  DrawDetails(model, 3 + gpu_lines + table + graph, details + 1, width);

  // Status line: a problem, the filter being typed, or the keys.
  std::string last;
  bool warn = false;
  if (!status.empty()) {
    last = std::string(status);
    warn = true;
  } else if (editing_filter_) {
    last = absl::StrCat("filter: ", model.filter(), "_   (Enter keep, Esc cancel)");
  } else {
    last = "q quit  s sort  r reverse  / filter  j/k select  t total/selected  ? help";
    if (!model.filter().empty()) {
      last = absl::StrCat("filter: ", model.filter(), " (Esc clears)  ", last);
    }
    if (width < 80 || height < 24) {
      absl::StrAppend(&last, absl::StrFormat("  [%dx%d < 80x24]", width, height));
    }
  }
  if (warn) wattron(stdscr, A_REVERSE | (colors_ ? COLOR_PAIR(kPairWarning) : 0));
  Put(height - 1, 0, Fit(last, static_cast<std::size_t>(width) - 1), width - 1);
  if (warn) wattroff(stdscr, A_REVERSE | (colors_ ? COLOR_PAIR(kPairWarning) : 0));
  if (show_help_) DrawHelp(height, width);
  wrefresh(stdscr);
}

void Dashboard::DrawTable(const TopModel& model, int top, int height, int width) {
  const std::size_t w = static_cast<std::size_t>(width);
  wattron(stdscr, A_REVERSE);
  Put(top, 0, model.HeaderLine(w), width);
  wattroff(stdscr, A_REVERSE);
  const int rows = height - 1;
  table_height_ = rows;
  const std::vector<Row>& all = model.rows();
  if (all.empty()) {
    Put(top + 1, 0,
        model.has_data()
            ? (model.filter().empty() ? "  no traced process" : "  no process matches the filter")
            : "  waiting for data...",
        width);
    return;
  }
  // Scroll so the selection stays on screen.
  const std::size_t selected = model.selected_index();
  const std::size_t visible = static_cast<std::size_t>(rows);
  if (selected < scroll_) scroll_ = selected;
  if (selected >= scroll_ + visible) scroll_ = selected + 1 - visible;
  if (scroll_ + visible > all.size()) scroll_ = all.size() > visible ? all.size() - visible : 0;
  for (std::size_t i = 0; i < visible && scroll_ + i < all.size(); ++i) {
    const std::size_t index = scroll_ + i;
    const bool is_selected = index == selected;
    if (is_selected) wattron(stdscr, A_REVERSE | A_BOLD);
    Put(top + 1 + static_cast<int>(i), 0, model.RowLine(all[index], w), width);
    if (is_selected) wattroff(stdscr, A_REVERSE | A_BOLD);
  }
}

void Dashboard::DrawGraph(const TopModel& model, int top, int height, int width) {
  const int rows = height - 1;
  const int axis = 7;
  const int columns_width = width - axis;
  std::vector<GraphColumn> columns =
      model.Graph(static_cast<std::size_t>(std::max(0, columns_width)));
  std::uint64_t scale = 0;
  for (const GraphColumn& column : columns) scale = std::max(scale, column.reserved);
  const std::string legend =
      unicode_ ? "  \u2588 allocated \u2591 reserved" : "  # allocated : reserved";
  wattron(stdscr, A_BOLD);
  Put(top, 0,
      Fit(absl::StrCat("Memory: ", model.GraphTitle(), legend), static_cast<std::size_t>(width)),
      width);
  wattroff(stdscr, A_BOLD);
  if (rows <= 0) return;
  Put(top + 1, 0, Fit(ShortBytes(scale), static_cast<std::size_t>(axis - 1), true), axis - 1);
  Put(top + rows, 0, Fit("0", static_cast<std::size_t>(axis - 1), true), axis - 1);
  if (scale == 0) return;
  for (int c = 0; c < columns_width; ++c) {
    const GraphColumn& column = columns[static_cast<std::size_t>(c)];
    if (!column.has_data) continue;
    // Heights in eighths of a row.
    const auto eighths = [&](std::uint64_t bytes) {
      return static_cast<long long>(static_cast<long double>(bytes) * rows * 8 / scale);
    };
    const long long reserved = eighths(column.reserved);
    const long long allocated = eighths(column.allocated);
    for (int r = 0; r < rows; ++r) {
      const long long in_reserved = std::clamp(reserved - r * 8ll, 0ll, 8ll);
      const long long in_allocated = std::clamp(allocated - r * 8ll, 0ll, 8ll);
      if (in_reserved == 0 && in_allocated == 0) break;
      const int y = top + rows - r;
      const int x = axis + c;
      if (in_allocated > 0) {
        if (colors_) wattron(stdscr, COLOR_PAIR(kPairAllocated));
        if (unicode_) {
          Put(y, x, kEighths[in_allocated - 1], 4);
        } else {
          Put(y, x, in_allocated >= 4 ? "#" : "_", 1);
        }
        if (colors_) wattroff(stdscr, COLOR_PAIR(kPairAllocated));
      } else {
        if (colors_) wattron(stdscr, COLOR_PAIR(kPairReserved));
        Put(y, x, unicode_ ? kShade : ":", unicode_ ? 4 : 1);
        if (colors_) wattroff(stdscr, COLOR_PAIR(kPairReserved));
      }
    }
  }
}

void Dashboard::DrawDetails(const TopModel& model, int top, int height, int width) {
  const int half = width / 2;
  const std::size_t left = static_cast<std::size_t>(half - 1);
  const std::size_t right = static_cast<std::size_t>(width - half);
  const Row* row = model.selected();
  wattron(stdscr, A_BOLD);
  Put(top, 0,
      Fit(row == nullptr
              ? "NVTX ranges"
              : absl::StrCat("NVTX ranges, pid ", row->process.pid(), " cuda:", row->device),
          left),
      half - 1);
  Put(top, half, Fit("Top sites (peak live)", right), width - half);
  wattroff(stdscr, A_BOLD);
  const int rows = height - 1;
  if (row == nullptr || rows <= 0) return;
  const std::vector<v1::NvtxRangeStats> ranges = model.SelectedRanges();
  if (ranges.empty()) Put(top + 1, 0, "  (none recorded)", half - 1);
  for (int i = 0; i < rows && i < static_cast<int>(ranges.size()); ++i) {
    const v1::NvtxRangeStats& range = ranges[static_cast<std::size_t>(i)];
    const std::string figures =
        absl::StrFormat(" %6s x%-4d", ShortBytes(range.peak_allocated_bytes()), range.count());
    const std::size_t name_width = left > figures.size() + 1 ? left - figures.size() - 1 : 0;
    Put(top + 1 + i, 0, absl::StrCat(" ", Fit(range.name(), name_width), figures), half - 1);
  }
  const std::vector<v1::SiteStats> sites = model.SelectedSites();
  if (sites.empty()) {
    Put(top + 1, half, model.has_details() ? "  (none recorded)" : "  (fetching...)", width - half);
  }
  for (int i = 0; i < rows && i < static_cast<int>(sites.size()); ++i) {
    const v1::SiteStats& site = sites[static_cast<std::size_t>(i)];
    const std::string where =
        site.frames_size() > 0 ? site.frames(0) : absl::StrFormat("site %#x", site.site());
    Put(top + 1 + i, half,
        Fit(absl::StrFormat("%6s %s", ShortBytes(site.peak_live_bytes()), where), right),
        width - half);
  }
}

void Dashboard::DrawHelp(int height, int width) {
  static const char* const kLines[] = {
      "vramscope top: keys",
      "",
      "  q, Ctrl-D       quit",
      "  s, F6           sort by the next column",
      "  r               reverse the order",
      "  /               filter by command or pid (Enter keeps, Esc cancels)",
      "  Esc             clear the filter",
      "  j/k, Up/Down    select a row; PgUp/PgDn, g/G (Home/End)",
      "  t               graph the selected row or the total",
      "  ?, h, F1        this help (any key closes it)",
      "",
      "Rows: one per process and device. ALLOC/RESERV: bytes now;",
      "PK-: peaks; FRAG: external fragmentation now; ALLOC/s: allocations",
      "per second since the last update; OOM: out-of-memory errors.",
  };
  const int lines = static_cast<int>(sizeof(kLines) / sizeof(kLines[0]));
  const int box_width = std::min(width - 2, 72);
  const int box_height = std::min(height - 2, lines + 2);
  const int y0 = (height - box_height) / 2;
  const int x0 = (width - box_width) / 2;
  for (int y = 0; y < box_height; ++y) {
    Put(y0 + y, x0, std::string(static_cast<std::size_t>(box_width), ' '), box_width);
  }
  for (int i = 0; i < lines && i < box_height - 2; ++i) {
    Put(y0 + 1 + i, x0 + 2, kLines[i], box_width - 4);
  }
  // A frame so the box stands out from the table under it.
  mvwhline(stdscr, y0, x0, ACS_HLINE, box_width);
  mvwhline(stdscr, y0 + box_height - 1, x0, ACS_HLINE, box_width);
  mvwvline(stdscr, y0, x0, ACS_VLINE, box_height);
  mvwvline(stdscr, y0, x0 + box_width - 1, ACS_VLINE, box_height);
}

}  // namespace vramscope::cli::top
